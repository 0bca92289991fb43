"""One ``bench.livekit_callers`` process as a client apart: its JSON lines as they come, and its
callers' summaries once it is told to hang up. Benchmarks and tests that place calls from processes
of their own drive them through this."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from bench.call_rig import REPO, child_env


class CallerProcess:
    """``sessions`` direct WebRTC callers against ``url`` (a worker's ``http://HOST:PORT``) for at most
    ``seconds``; ``extra``: more of livekit_callers' flags; ``stderr``: a file for its errors."""

    def __init__(self, url: str, speech: str | Path, seconds: float, *, sessions: int = 1, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, stderr: Path | None = None) -> None:
        self.command = [sys.executable, "-m", "bench.livekit_callers", "--transport", "direct", "--url", url,
                        "--sessions", str(sessions), "--seconds", str(seconds), "--speech", str(speech), *extra]
        self.env = env or child_env()
        self.stderr_path = stderr
        self.lines: list[dict[str, Any]] = []
        self.ready = asyncio.Event()  # its callers hear the agent, or it gave up on that
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> CallerProcess:
        stderr = self.stderr_path.open("w") if self.stderr_path is not None else None
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, cwd=REPO, env=self.env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr if stderr is not None else asyncio.subprocess.DEVNULL)
        finally:
            if stderr is not None:
                stderr.close()  # the child holds its own descriptor
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            if not line.startswith(b"{"):
                continue
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                self.lines.append(message)
                if message.get("event") in ("ready", "not_ready"):
                    self.ready.set()

    def event(self, kind: str) -> dict[str, Any] | None:
        return next((line for line in self.lines if line.get("event") == kind), None)

    def progress(self) -> dict[str, Any] | None:
        """Its latest report after an interruption (``attempts`` so far)."""
        return next((line for line in reversed(self.lines) if line.get("event") == "progress"), None)

    async def hang_up(self, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """Close its stdin (its callers hang up and report); their summaries, none if it printed none."""
        if self.process is None:
            return []
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await self._reader  # the pipe ends with the process
        done = self.event("done")
        return list(done["callers"]) if done else []
