"""Real ``duplex-agent serve`` processes for the several-backend tests: backends a test can SIGKILL, and a front."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """``duplex-agent serve`` on a loopback port, its log in a file."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.args = [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--host", "127.0.0.1",
                     "--port", str(self.port), *args]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Serve:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
        env["HF_HUB_OFFLINE"] = "1"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self

    async def health(self) -> dict | None:
        try:
            async with aiohttp.ClientSession() as http, http.get(self.http + "/healthz") as reply:
                return await reply.json()
        except (aiohttp.ClientError, OSError):
            return None

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http, http.get(self.http + "/metrics") as reply:
            return await reply.text()

    async def ready(self, timeout: float = 120.0) -> Serve:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.health() is None:
            assert self.process is not None and self.process.poll() is None, self.log()[-3000:]
            assert loop.time() < deadline, f"serve did not come up: {self.log()[-3000:]}"
            await asyncio.sleep(0.2)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a host that dies; returns once the process is gone (its port is free)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    async def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while self.process.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        return self.process.returncode
