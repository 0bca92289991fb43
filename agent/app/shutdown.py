"""Graceful shutdown: the first SIGTERM or SIGINT drains, a second exits at once.

Draining stops admitting new sessions, lets live ones finish for up to the drain
timeout, then closes what is left with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from duplex_agent.agent.session.ports import DuplexBackend

log = logging.getLogger("duplex_agent.shutdown")
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How often a drain looks at the session count.
_DRAIN_POLL_S = 0.1


class ShutdownSignals:
    """``requested`` is set by the first signal; the second ends the process now."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.signal_name = ""

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.requested.is_set():
            log.warning("second %s: exiting now", sig.name)
            os._exit(128 + sig.value)
        self.signal_name = sig.name
        log.warning("%s: draining (a second signal exits at once)", sig.name)
        self.requested.set()


async def drain(backend: DuplexBackend, timeout_s: float) -> int:
    """Stop admitting, wait up to ``timeout_s`` for live sessions to end; returns how many were left."""
    backend.stop_admitting()
    deadline = time.monotonic() + timeout_s
    if backend.active_sessions:
        log.info("waiting up to %.0f s for %d live session(s)", timeout_s, backend.active_sessions)
    while backend.active_sessions and time.monotonic() < deadline:
        await asyncio.sleep(_DRAIN_POLL_S)
    return backend.active_sessions
