"""The media timeout of a direct call: no RTP from the caller for ``timeout_s`` ends the call.

Packets that return sooner keep it (a tunnel, a Wi-Fi handover, the 3 s blackout of
tests/network): the receive buffer conceals the gap and the caller is heard again. The
reader notes each packet's arrival (``last_packet_at``, its loop's clock); one timer
looks at it only when the timeout would run out, so a packet costs no timer. A timer
that fires late means the loop was held up, not that the caller stopped: the packets of
that time may still be queued in the socket and aiortc's pipeline, so they get as long
again (at most ``STALL_GRACE_S``) to be read before the call is judged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: A timer this late means the loop was held up.
STALL_S = 0.25
STALL_GRACE_S = 1.0


class MediaWatchdog:
    """Calls ``on_timeout()`` once when ``last_packet_at()`` (loop time, None: no packet yet) is
    ``timeout_s`` behind the loop's clock, counting from ``start()`` (the connection is up)."""

    def __init__(self, timeout_s: float, last_packet_at: Callable[[], float | None],
                 on_timeout: Callable[[], None]) -> None:
        if timeout_s <= 0:
            raise ValueError("the media timeout must be a positive number of seconds")
        self._loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self._last_packet_at = last_packet_at
        self._on_timeout = on_timeout
        self._started_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._held = False  # the last timer fired late: this one gives the queued packets their time
        self.timed_out = False

    def start(self) -> None:
        if self._started_at is None and not self.timed_out:
            self._started_at = self._loop.time()
            self._arm(self._started_at + self.timeout_s)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._started_at = None

    def _last_sign_of_life(self) -> float:
        assert self._started_at is not None
        return max(self._started_at, self._last_packet_at() or self._started_at)

    def _arm(self, at: float) -> None:
        self._timer = self._loop.call_at(at, self._check, at)

    def _check(self, due: float) -> None:
        self._timer = None
        now = self._loop.time()
        if not self._held and now - due > STALL_S:
            self._held = True
            self._arm(now + min(now - due, STALL_GRACE_S))
            return
        self._held = False
        runs_out = self._last_sign_of_life() + self.timeout_s
        if now < runs_out:
            self._arm(runs_out)
            return
        self.timed_out = True
        self._started_at = None
        self._on_timeout()
