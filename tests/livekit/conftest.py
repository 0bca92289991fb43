from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from devtools.livekit_server import LoopbackLiveKitServer

# At exit, dispose livekit's FFI and wait out its callbacks before the interpreter finalizes.
from duplex_agent.webrtc.livekit import ffi_router  # noqa: F401
from tests.serve_process import REPO, AgentProcess, ServeProcess  # noqa: F401 (tests.livekit_agents imports REPO)
from tests.serve_process import environment as _environment

AGENT_NAME = "duplex-test"


@pytest.fixture
async def livekit_server(tmp_path):
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-loopback-tests")
    with _server_log(tmp_path / "livekit-server.log") as log_path:
        await server.start()
        yield server
        # shown with a failure: where each caller's audio got to (the server's own packet record)
        with contextlib.suppress(TimeoutError):  # its loop is stuck: the stop below says so
            print("--- the loopback server's audio forwarding ---\n" + server.forwarding_summary())
        await asyncio.wait_for(server.stop(), 20)
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if " -> ping" not in line]
    print("--- the loopback server's log (last 60 lines, pings left out) ---\n" + "\n".join(lines[-60:]))


@contextlib.contextmanager
def _server_log(path: Path):
    """The loopback server's own records (its signal requests, tracks published and subscribed) in
    ``path``: a failure shows where a track's way to its subscriber stopped."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("devtools.livekit_server")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # its tail is printed once, below the test
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        handler.close()


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
        print(process.report())
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

    async def start(*args: str, plugin: str = "reference", max_sessions: int = 4,
                    drain_timeout: float = 10.0) -> ServeProcess:
        serve = ServeProcess(tmp_path / f"serve{len(processes)}.log", "--plugin", plugin, "--max-sessions",
                             str(max_sessions), "--drain-timeout", str(drain_timeout), *args)
        processes.append(serve)
        serve.start()
        await serve.ready(90)
        return serve

    return start
