"""The local backend: session runners over an in-process plugin and engine."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.ports import AdmissionError, DuplexBackend
from duplex_agent.agent.session.runner import DuplexSessionRunner
from duplex_agent.plugins.contract import DuplexCapabilities, DuplexModelPlugin
from duplex_agent.plugins.contract.engine import DuplexEngine
from duplex_agent.plugins.contract.loops import run_in_owner_loops

#: How long ``close()`` waits for a runner living on another loop (a LiveKit job's) to close.
_CROSS_LOOP_CLOSE_S = 5.0


class LocalBackend(DuplexBackend):
    """Admits up to ``max_sessions`` conversations; each gets its own runner."""

    def __init__(
        self,
        plugin: DuplexModelPlugin,
        engine: DuplexEngine,
        *,
        max_sessions: int = 8,
        limits: SessionLimits | None = None,
        vad_model: SileroVadModel | None = None,
    ) -> None:
        self.plugin = plugin
        self.engine = engine
        self.max_sessions = max_sessions
        self.limits = limits or SessionLimits()
        self._vad_model = vad_model
        self._capabilities = plugin.capabilities(max_sessions=max_sessions)
        #: live runners and the loop each one lives in
        self._runners: dict[str, tuple[DuplexSessionRunner, asyncio.AbstractEventLoop]] = {}
        # LiveKit jobs open sessions from their own threads: admission must be atomic.
        self._admission = threading.Lock()
        self._admitting = True

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self._capabilities

    @property
    def active_sessions(self) -> int:
        return len(self._runners)

    @property
    def runners(self) -> list[DuplexSessionRunner]:
        return [runner for runner, _ in list(self._runners.values())]

    async def start(self) -> None:
        """The plugin's start-up check (an endpoint it needs, say): it warns, and the worker starts anyway."""
        await self.plugin.check_at_start()

    async def open(self) -> DuplexSessionRunner:
        runner = DuplexSessionRunner(
            self.plugin,
            self.engine,
            self._capabilities,
            limits=self.limits,
            vad_model=self._vad_model,
            on_close=lambda r: self._runners.pop(r.session_id, None),
        )
        with self._admission:
            if not self._admitting:
                raise AdmissionError("this worker is shutting down", code="shutting_down")
            if len(self._runners) >= self.max_sessions:
                raise AdmissionError(f"all {self.max_sessions} sessions are in use; try again later")
            self._runners[runner.session_id] = (runner, asyncio.get_running_loop())
        runner.start()
        return runner

    def stop_admitting(self) -> None:
        with self._admission:
            self._admitting = False

    async def close(self) -> None:
        """Close every live runner, each in its own loop (``session.closed`` with reason ``shutdown``), then the engine."""
        live = list(self._runners.values())
        await run_in_owner_loops(((loop, partial(runner.close, "shutdown")) for runner, loop in live),
                                 timeout_s=_CROSS_LOOP_CLOSE_S)
        await self.engine.close()
