"""Real ``duplex-agent`` commands as subprocesses for the tests, above all ``serve`` on a loopback port.

Each has its log in a file, is waited on by its own health route (never by a sleep), and is stopped
by SIGTERM (SIGKILL only past a generous deadline, or when a test kills a host on purpose).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[1]
#: How long a stopped process may take to drain and exit (the tests' drain timeouts are shorter).
STOP_TIMEOUT_S = 30.0


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without LiveKit or duplex settings, plus ``settings`` (secrets go here, never argv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    # One intra-op thread for torch (the tiny Moshi): a worker under test shares 2 cores with the rest
    # of the suite, where a thread per core leaves each step's parallel region waiting on a starved one.
    env["OMP_NUM_THREADS"] = "1"
    env.update(settings)
    return env


class AgentProcess:
    """A ``duplex-agent`` command (``args`` after the program name) as a subprocess, its log in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = [sys.executable, "-m", "duplex_agent.agent.app.cli", *args]
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self):
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def report(self) -> str:
        """What a test prints of this process at teardown: its log's tail."""
        return f"--- {self.log_path.name} (tail) ---\n" + self.log()[-4000:]

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        assert self.process is not None and self.process.poll() is None, "the process has already exited"
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, as a host that dies; returns once the process is gone (its port is free)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    async def exited(self, timeout: float = STOP_TIMEOUT_S) -> int:
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
        """SIGTERM (if still running) and the exit code; SIGKILL past ``STOP_TIMEOUT_S`` (a code the tests refuse)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await self.exited()
        except AssertionError:
            self.process.kill()  # the process must not outlive the test
            return self.process.wait(5)


class ServeProcess(AgentProcess):
    """``duplex-agent serve`` on a free loopback port; ``args`` are more ``serve`` arguments."""

    def __init__(self, log_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        super().__init__(["serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
                         environment() if env is None else env, log_path)

    @property
    def realtime_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def health(self) -> dict | None:
        """What /healthz answers (``sessions``, ``max_sessions``), None while nothing answers."""
        try:
            async with aiohttp.ClientSession() as http, http.get(self.http + "/healthz") as reply:
                return await reply.json()
        except (aiohttp.ClientError, OSError):
            return None

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as http, http.get(self.http + "/metrics") as reply:
            return await reply.text()

    async def ready(self, timeout: float = 120.0) -> ServeProcess:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.health() is None:
            assert self.process is not None and self.process.poll() is None, self.log()[-3000:]
            assert loop.time() < deadline, f"serve did not come up in {timeout:g} s: {self.log()[-3000:]}"
            await asyncio.sleep(0.2)
        return self

    async def until_sessions(self, count: int, timeout: float = 60.0) -> None:
        """Wait until this server's own /healthz counts ``count`` live sessions."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while ((await self.health()) or {}).get("sessions") != count:
            assert loop.time() < deadline, f"serve never had {count} session(s): {await self.health()}"
            await asyncio.sleep(0.1)
