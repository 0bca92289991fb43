"""Deadline-aligned silence continuation for continuous-input models.

A continuous model needs a unit of input every unit period to keep its turn
going. When the caller's audio stops, silence units are due at
``anchor + k * period``: computed from the anchor, never from the time the
previous unit went out, so the schedule does not drift. Real input re-anchors
the schedule; a tick that finds the schedule moved is stale and skipped, and
ticks the loop could not serve in time are skipped rather than sent in a burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from duplex_agent.plugins.contract import DuplexModelSessionState


@dataclass(frozen=True, slots=True)
class SilenceTick:
    """Mailbox command: a silence unit is due at ``deadline``.

    ``scheduled`` is the deadline the schedule held when the tick was posted; ``deadline``
    is later by ``skipped`` whole periods when the loop woke too late to serve those.
    """

    deadline: float
    scheduled: float
    skipped: int = 0
    event_id: None = None


class SilenceContinuation:
    """Posts a ``SilenceTick`` for each due unit; the deadlines live in the model's session state.

    ``post`` queues the tick in the session's mailbox; the session calls ``advance`` once it
    has handled the tick (whether or not the submit worked) and ``anchor`` on real input.
    Only those two calls, made by the session's mailbox task, write the session state;
    the scheduling task only reads it.
    """

    def __init__(
        self,
        post: Callable[[SilenceTick], None],
        *,
        period_s: float,
        state: DuplexModelSessionState,
        clock: Callable[[], float],
        enabled: bool,
    ) -> None:
        self._post = post
        self._state = state
        self._clock = clock
        self.enabled = enabled
        self.period_s = period_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.skipped_units = 0

    def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._schedule(), name="silence-continuation")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def anchor(self) -> None:
        """Real input was just submitted: the next silence unit is one period from now."""
        if not self.enabled:
            return
        state = self._state
        now = self._clock()
        state.last_native_submit_monotonic = now
        state.silence_deadline_monotonic = now + self.period_s
        self._wake.set()

    def is_current(self, tick: SilenceTick) -> bool:
        return self._state.silence_deadline_monotonic == tick.scheduled

    def advance(self, tick: SilenceTick) -> None:
        """The unit for ``tick`` was handled (submitted or failed); the next one is due a period later."""
        state = self._state
        self.skipped_units += tick.skipped
        state.continuation_units += 1
        state.silence_deadline_monotonic = tick.deadline + self.period_s
        self._wake.set()

    async def _schedule(self) -> None:
        state = self._state
        while True:
            deadline = state.silence_deadline_monotonic
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
                continue
            delay = deadline - self._clock()
            if delay > 0:
                # A timer, not wait_for: wait_for can swallow a cancel that races its timeout,
                # and then stop() would wait forever.
                timer = asyncio.get_running_loop().call_later(delay, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
                continue  # due now, re-anchored or advanced: recompute
            late = self._clock() - deadline
            missed = int(late // self.period_s) if late >= self.period_s else 0
            self._post(SilenceTick(deadline + missed * self.period_s, deadline, missed))
            await self._wake.wait()  # the runner advances (or re-anchors) the schedule
