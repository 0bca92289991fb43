"""``make livekit-dev`` with ``--host 127.0.0.1`` listens on 127.0.0.1 only, and Ctrl-C stops all of it.

The whole process tree (devtools.livekit_dev, the loopback LiveKit server, the ``duplex-agent dev``
worker with its page and livekit-agents' own HTTP server) is started as the Makefile starts it; once
the worker has registered, every listening TCP socket of every process in the tree must be on the
given address. UDP sockets (WebRTC media: aiortc in the server binds the machine's interface for
ICE) are not listeners and are not checked here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.serve_process import REPO, environment
from tests.support.ports import free_port
from tests.support.waits import until

HOST = "127.0.0.1"
#: Starting the worker loads the reference model (Whisper, Piper, Silero) on a shared 2-core machine.
START_TIMEOUT_S = 180.0
#: livekit_dev gives the agent its drain, then the server; each has its own deadline inside.
STOP_TIMEOUT_S = 60.0


def listeners(root: psutil.Process) -> list[tuple[int, str, str, int]]:
    """(pid, name, address, port) of every listening TCP socket (v4 and v6) of ``root`` and its descendants."""
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            name = " ".join(process.cmdline()[1:4])
            for conn in process.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((process.pid, name, conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            continue
    return found


async def page_answers(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://{HOST}:{port}/") as reply:
            return reply.status == 200
    except (aiohttp.ClientError, OSError):
        return False


@pytest.mark.parametrize("mode", ["worker", "app"])
async def test_livekit_dev_listens_only_on_the_given_host_and_ctrl_c_stops_it_all(tmp_path: Path, mode: str):
    livekit_port, port = free_port(), free_port()
    if mode == "worker":  # make livekit-dev
        args = ["--livekit-port", str(livekit_port), "--", "--host", HOST, "--port", str(port)]
    else:  # make livekit-agents-dev
        args = ["--livekit-port", str(livekit_port), "--app", "examples/livekit_agents_app.py",
                "--host", HOST, "--port", str(port)]
    log_path = tmp_path / "livekit_dev.log"
    with log_path.open("w") as log:
        # A session of its own: SIGINT to its group below is what Ctrl-C in a terminal sends.
        tree = subprocess.Popen([sys.executable, "-m", "devtools.livekit_dev", *args], cwd=REPO,
                                env=environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_text() -> str:
        return log_path.read_text(errors="replace")

    def registered() -> bool:
        assert tree.poll() is None, f"livekit_dev exited with {tree.returncode}:\n{log_text()[-4000:]}"
        return "registered worker" in log_text()

    root = psutil.Process(tree.pid)
    descendants: list[psutil.Process] = []
    try:
        await until(registered, START_TIMEOUT_S, "the agent to register with the loopback server", every=0.2)
        await until(lambda: page_answers(port), 30, f"the page on {HOST}:{port}", every=0.2)
        descendants = root.children(recursive=True)
        found = listeners(root)
        udp = [(p.pid, c.laddr) for p in [root, *descendants] for c in p.net_connections(kind="udp")]
        print("listening TCP sockets:", *found, "UDP sockets:", *udp, sep="\n  ")
        ports = {listened for _, _, _, listened in found}
        assert {livekit_port, port} <= ports, found  # the server's and the page's, at least
        elsewhere = [entry for entry in found if entry[2] != HOST]
        assert not elsewhere, f"listening beyond {HOST}: {elsewhere}"
    finally:
        if tree.poll() is None:
            os.killpg(tree.pid, signal.SIGINT)  # Ctrl-C
        try:
            code = tree.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(tree.pid, signal.SIGKILL)
            tree.wait(10)
            raise AssertionError(f"livekit_dev still ran {STOP_TIMEOUT_S:g} s after Ctrl-C:\n{log_text()[-4000:]}") from None
        finally:
            print(f"--- livekit_dev log (tail) ---\n{log_text()[-4000:]}")
    assert code == 0, code
    _, alive = psutil.wait_procs(descendants, timeout=STOP_TIMEOUT_S)
    for process in alive:  # never left behind by the test either
        process.kill()
    assert not alive, f"still running after Ctrl-C: {alive}"


def test_livekit_dev_gives_the_server_the_workers_own_host(monkeypatch):
    from devtools.livekit_dev import worker_host

    monkeypatch.delenv("DUPLEX_HOST", raising=False)
    assert worker_host(["--port", "8081"]) == "127.0.0.1"  # the worker's default
    assert worker_host(["--host", "192.0.2.7", "--port", "8081"]) == "192.0.2.7"
    assert worker_host(["--host=::1"]) == "::1"
    monkeypatch.setenv("DUPLEX_HOST", "0.0.0.0")
    assert worker_host([]) == "0.0.0.0"
    assert worker_host(["--host", "127.0.0.1"]) == "127.0.0.1"  # the flag over the environment, as the worker reads
