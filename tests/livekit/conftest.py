from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from devtools.livekit_server import LoopbackLiveKitServer

# At exit, dispose livekit's FFI and wait out its callbacks before the interpreter finalizes.
from duplex_agent.webrtc.livekit import ffi_router  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
AGENT_NAME = "duplex-test"
#: How long a stopped process may take to drain and exit (its drain timeout is shorter).
EXIT_TIMEOUT_S = 30.0


@pytest.fixture
async def livekit_server():
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-loopback-tests")
    await server.start()
    yield server
    await asyncio.wait_for(server.stop(), 20)


def _environment(**settings: str) -> dict[str, str]:
    """This process's environment without LiveKit or duplex settings, plus ``settings`` (secrets go here, never argv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    env.update(settings)
    return env


class AgentProcess:
    """A real ``duplex-agent`` command as a subprocess, its log in a file; stopped by signal, never killed."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = [sys.executable, "-m", "duplex_agent.agent.app.cli", *args]
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        assert self.process is not None and self.process.poll() is None, "the process has already exited"
        self.process.send_signal(sig)

    async def exited(self, timeout: float = EXIT_TIMEOUT_S) -> int:
        """The exit code, once the process has exited on its own; AssertionError past ``timeout``."""
        assert self.process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.process.poll() is None:
            if loop.time() > deadline:
                raise AssertionError(f"{self.log_path.name}: still running {timeout:g} s after the signal")
            await asyncio.sleep(0.05)
        return self.process.returncode

    async def stop(self) -> int | None:
        """SIGTERM (if still running) and the exit code; the teardown checks it is 0."""
        if self.process is None:
            return None
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            return await self.exited()
        finally:
            if self.process.poll() is None:  # a failed drain fails the test; the process must not outlive it
                self.process.kill()
                self.process.wait(5)
            self._log.close()


class WorkerProcess(AgentProcess):
    """``duplex-agent start``: a LiveKit worker for the loopback server."""

    def __init__(self, server: LoopbackLiveKitServer, log_path: Path, *, max_sessions: int = 2,
                 url: str | None = None, secret: str | None = None, plugin: str = "reference",
                 backend: str | None = None, drain_timeout: float = 10.0, extra: tuple[str, ...] = ()) -> None:
        env = _environment(LIVEKIT_URL=url or server.url, LIVEKIT_API_KEY=server.api_key,
                           LIVEKIT_API_SECRET=secret or server.api_secret,
                           # the reference model on a loaded 2-core machine can take seconds per sentence
                           DUPLEX_BACKEND_STALL_TIMEOUT="20")
        args = ["start", "--agent-name", AGENT_NAME, "--max-sessions", str(max_sessions),
                "--drain-timeout", str(drain_timeout), *extra]
        args += ["--backend", backend] if backend else ["--plugin", plugin]
        super().__init__(args, env, log_path)


class ServeProcess(AgentProcess):
    """``duplex-agent serve``: the embedded worker, here the duplex backend of a LiveKit worker."""

    def __init__(self, port: int, log_path: Path, *, plugin: str = "reference", max_sessions: int = 4,
                 drain_timeout: float = 10.0) -> None:
        self.port = port
        args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--plugin", plugin,
                "--max-sessions", str(max_sessions), "--drain-timeout", str(drain_timeout)]
        super().__init__(args, _environment(), log_path)

    @property
    def realtime_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1"

    async def health(self) -> dict | None:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{self.port}/healthz") as r:
                return await r.json()
        except aiohttp.ClientError:
            return None

    async def until_sessions(self, count: int, timeout: float = 60.0) -> None:
        """Wait until this server's own /healthz counts ``count`` live sessions."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while ((await self.health()) or {}).get("sessions") != count:
            assert loop.time() < deadline, f"serve never had {count} session(s): {await self.health()}"
            await asyncio.sleep(0.1)

    async def ready(self, timeout: float = 90.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.health() is None:
            assert self.process is not None and self.process.poll() is None, self.log()[-3000:]
            assert loop.time() < deadline, "serve did not come up"
            await asyncio.sleep(0.2)


@pytest.fixture
async def processes(tmp_path):
    """Every process a test starts; each must exit 0 on SIGTERM at teardown (no SIGKILL needed)."""
    started: list[AgentProcess] = []
    yield started
    codes = {}
    for process in reversed(started):  # workers before the backends they use
        if process.process is not None and process.process.returncode is None:
            codes[process.log_path.name] = await process.stop()
    for process in started:
        print(f"--- {process.log_path.name} (tail) ---\n" + process.log()[-4000:])
    assert all(code == 0 for code in codes.values()), codes


@pytest.fixture
def start_worker(livekit_server, tmp_path, processes):
    async def start(**kwargs) -> WorkerProcess:
        worker = WorkerProcess(livekit_server, tmp_path / f"worker{len(processes)}.log", **kwargs)
        processes.append(worker)
        worker.start()
        return worker

    return start


@pytest.fixture
def ready_worker(livekit_server, start_worker):
    """ready_worker(**kwargs): a started worker, registered and available for dispatch."""

    async def ready(**kwargs) -> WorkerProcess:
        worker = await start_worker(**kwargs)
        await livekit_server.wait_for_worker(AGENT_NAME, available=True, timeout=90)
        return worker

    return ready


@pytest.fixture
def start_serve(tmp_path, processes):
    """start_serve(*args, **kwargs): a ``serve`` process on a free port, answering /healthz; ``args``
    are more ``serve`` arguments."""

    async def start(*args: str, **kwargs) -> ServeProcess:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve = ServeProcess(port, tmp_path / f"serve{len(processes)}.log", **kwargs)
        serve.args += list(args)
        processes.append(serve)
        serve.start()
        await serve.ready()
        return serve

    return start
