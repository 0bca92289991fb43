from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.livekit_server import LoopbackLiveKitServer

REPO = Path(__file__).resolve().parents[2]
AGENT_NAME = "duplex-test"


@pytest.fixture
async def livekit_server():
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-loopback-tests")
    await server.start()
    yield server
    await asyncio.wait_for(server.stop(), 20)


class WorkerProcess:
    """The real worker (`duplex-agent start`) as a subprocess, its log in a file."""

    def __init__(self, server: LoopbackLiveKitServer, log_path: Path, *, max_sessions: int = 2,
                 url: str | None = None, secret: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.log_path = log_path
        self.args = [
            sys.executable, "-m", "duplex_agent.agent.app.cli", "start",
            "--livekit-url", url or server.url,
            "--livekit-api-key", server.api_key,
            "--agent-name", AGENT_NAME,
            "--max-sessions", str(max_sessions),
            "--plugin", "reference",
            *extra,
        ]
        self.secret = secret or server.api_secret  # given by environment: argv is visible in ps
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
        env["HF_HUB_OFFLINE"] = "1"
        env["LIVEKIT_API_SECRET"] = self.secret
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode


@pytest.fixture
def start_worker(livekit_server, tmp_path):
    workers: list[WorkerProcess] = []

    async def start(**kwargs) -> WorkerProcess:
        worker = WorkerProcess(livekit_server, tmp_path / f"worker{len(workers)}.log", **kwargs)
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for worker in workers:
        worker.stop()
        print(f"--- {worker.log_path.name} (tail) ---\n" + worker.log()[-3000:])


@pytest.fixture
def ready_worker(livekit_server, start_worker):
    """ready_worker(**kwargs): a started worker, registered and available for dispatch."""

    async def ready(**kwargs) -> WorkerProcess:
        worker = await start_worker(**kwargs)
        await livekit_server.wait_for_worker(AGENT_NAME, available=True, timeout=60)
        return worker

    return ready
