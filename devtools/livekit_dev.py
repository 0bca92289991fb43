"""LiveKit on this machine: the loopback LiveKit server and ``duplex-agent dev`` against it.

    python -m devtools.livekit_dev [--livekit-port 7880] [-- DEV_ARGS...]   (``make livekit-dev``)

Prints the page's address; Ctrl-C (or SIGTERM) stops the worker, then the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

API_KEY, API_SECRET = "devkey", "secret"  # the loopback server's defaults; dev credentials only


def _args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    own, dev_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m devtools.livekit_dev", description=__doc__.split("\n")[0])
    parser.add_argument("--livekit-port", type=int, default=7880, help="the loopback LiveKit server's port")
    return parser.parse_args(own), dev_args


def main(argv: list[str] | None = None) -> int:
    ns, dev_args = _args(argv)
    # pyjwt warns on every token signed with a key this short; it is the dev key on purpose.
    env = {**os.environ, "LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": API_SECRET,
           "PYTHONWARNINGS": "ignore:The HMAC key is"}
    server = subprocess.Popen([sys.executable, "-m", "devtools.livekit_server", "--port", str(ns.livekit_port),
                               "--print-url"], env=env, stdout=subprocess.PIPE, text=True)
    worker = None
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        url = server.stdout.readline().strip()
        if not url:
            print("livekit-dev: the loopback LiveKit server did not start", file=sys.stderr)
            return 1
        print(f"livekit-dev: loopback LiveKit server on {url} (keys {API_KEY}/{API_SECRET})", flush=True)
        binary = Path(sys.executable).with_name("duplex-agent")
        command = [str(binary)] if binary.exists() else [sys.executable, "-m", "duplex_agent.agent.app.cli"]
        worker = subprocess.Popen([*command, "dev", *dev_args], env={**env, "LIVEKIT_URL": url})
        print("livekit-dev: open the address `duplex-agent dev` prints below, choose LiveKit and press Connect "
              "(Ctrl-C stops both)", flush=True)
        return worker.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (worker, server):
            if process is not None:
                _stop(process)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C in a terminal has signalled the whole group already: give it a moment, then signal it."""
    for send in (None, signal.SIGINT, signal.SIGKILL):
        if send is not None:
            process.send_signal(send)
        try:
            process.wait(timeout=5 if send is None else 30)
            return
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    sys.exit(main())
