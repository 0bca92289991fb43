"""An event loop on a virtual clock: when nothing is ready to run, time jumps to the next timer.

Logic that waits on timers (timeouts, delays, call_later) runs at once, and the times it sees are
exact; a test reads ``loop.time()`` as the clock. Real I/O still wakes the loop (the selector is
asked first without waiting), so threads and sockets work, but while any is awaited without a timer
the loop blocks on it for real.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop_clock: list[float]) -> None:
        super().__init__()
        self._clock = loop_clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer at all: only I/O (a thread's result) can wake the loop
            return super().select(None)
        self._clock[0] += timeout  # nothing to do until the next timer: go there
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = [0.0]
        super().__init__(_JumpingSelector(self._virtual_now))

    def time(self) -> float:
        return self._virtual_now[0]


def run_virtual(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on a virtual clock."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
