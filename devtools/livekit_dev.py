"""LiveKit on this machine: the loopback LiveKit server, and an agent against it.

    python -m devtools.livekit_dev [--livekit-port 7880] [-- DEV_ARGS...]   (``make livekit-dev``)
        the worker itself, ``duplex-agent dev DEV_ARGS``, which also serves the page;
    python -m devtools.livekit_dev --app examples/livekit_agents_app.py [--livekit-port 7880]
            [--host 127.0.0.1] [--port 8080]                                (``make livekit-agents-dev``)
        a LiveKit Agents app, run as livekit-agents runs one in development
        (``python -m livekit.agents start APP --dev``), and the page served here.

Everything listens on one address: the worker's ``--host`` (``DUPLEX_HOST``, default 127.0.0.1),
or with --app ``--host``: the loopback server's signal port, the page, and livekit-agents' own
HTTP server (the app is told through ``DUPLEX_HOST``). Media (UDP, ICE) goes over the machine's
interface, as aiortc's ICE skips loopback.

Either way the page's dev tokens dispatch the agent name the agent registers under
(``agent_name``, ``DUPLEX_AGENT_NAME``; the app gets it as ``LIVEKIT_AGENT_NAME``), so
pressing Connect in the page's LiveKit mode brings the agent into the room. Prints the
page's address; Ctrl-C (or SIGTERM) stops the agent, then the server.
"""

from __future__ import annotations

import argparse
import asyncio
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
    parser.add_argument("--app", help="a LiveKit Agents app (a file defining an AgentServer) to run instead of "
                                      "`duplex-agent dev`")
    parser.add_argument("--host", default="127.0.0.1", help="with --app: the address the page, the app and the "
                                                              "LiveKit server listen on")
    parser.add_argument("--port", type=int, default=8080, help="with --app: the page's port")
    ns = parser.parse_args(own)
    if dev_args and ns.app:
        parser.error("arguments after -- go to `duplex-agent dev`, which --app does not run")
    return ns, dev_args


def agent_name() -> str:
    """The name the page's tokens dispatch: the worker's ``agent_name`` setting."""
    from duplex_agent.agent.app.settings import Settings

    return Settings.from_env(dict(os.environ)).agent_name


def worker_host(dev_args: list[str]) -> str:
    """The address ``duplex-agent dev DEV_ARGS`` will listen on: its ``--host``, else its setting's default."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host")
    given, _ = parser.parse_known_args(dev_args)
    if given.host is not None:
        return str(given.host)
    from duplex_agent.agent.app.settings import Settings

    return Settings.from_env(dict(os.environ)).host


def main(argv: list[str] | None = None) -> int:
    ns, dev_args = _args(argv)
    host = ns.host if ns.app else worker_host(dev_args)
    # pyjwt warns on every token signed with a key this short; it is the dev key on purpose.
    env = {**os.environ, "LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": API_SECRET,
           "PYTHONWARNINGS": "ignore:The HMAC key is"}
    server = subprocess.Popen([sys.executable, "-m", "devtools.livekit_server", "--host", host,
                               "--port", str(ns.livekit_port), "--print-url"], env=env, stdout=subprocess.PIPE, text=True)
    agent = None
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        url = server.stdout.readline().strip()
        if not url:
            print("livekit-dev: the loopback LiveKit server did not start", file=sys.stderr)
            return 1
        print(f"livekit-dev: loopback LiveKit server on {url} (keys {API_KEY}/{API_SECRET})", flush=True)
        env["LIVEKIT_URL"] = url
        if ns.app:
            return asyncio.run(_run_app(ns, env, url))
        binary = Path(sys.executable).with_name("duplex-agent")
        command = [str(binary)] if binary.exists() else [sys.executable, "-m", "duplex_agent.agent.app.cli"]
        agent = subprocess.Popen([*command, "dev", *dev_args], env=env)
        print("livekit-dev: open the address `duplex-agent dev` prints below, choose LiveKit and press Connect "
              "(Ctrl-C stops both)", flush=True)
        return agent.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (agent, server):
            if process is not None:
                _stop(process)


async def _run_app(ns: argparse.Namespace, env: dict[str, str], url: str) -> int:
    """The page (with dev tokens for ``url``) on ns.host:ns.port, and the app until it exits."""
    from aiohttp import web

    from duplex_agent.agent.app.access.guard import install_access_control
    from duplex_agent.frontend import register_frontend_routes
    from duplex_agent.webrtc.livekit.tokens import register_livekit_token_routes

    name = agent_name()
    app = web.Application()
    register_frontend_routes(app)
    register_livekit_token_routes(app, url=url, api_key=API_KEY, api_secret=API_SECRET, agent_name=name)
    install_access_control(app)  # as the worker's own page: /api/access says no key is needed
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    agent = None
    try:
        await web.TCPSite(runner, ns.host, ns.port).start()
        # As `lk agent dev` runs an app (livekit-agents 1.8.9 deprecates the app's own `dev` subcommand).
        # DUPLEX_HOST: where the example has livekit-agents' HTTP server listen (by default, every interface).
        agent = subprocess.Popen([sys.executable, "-m", "livekit.agents", "start", ns.app, "--dev"],
                                 env={**env, "LIVEKIT_AGENT_NAME": name, "DUPLEX_HOST": ns.host})
        print(f"livekit-dev: {ns.app} registers as agent {name!r}; open http://{ns.host}:{ns.port}/, choose "
              "LiveKit, get a dev token and press Connect (Ctrl-C stops both)", flush=True)
        return await asyncio.to_thread(agent.wait)
    finally:
        if agent is not None:
            await asyncio.to_thread(_stop, agent)
        await runner.cleanup()


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
