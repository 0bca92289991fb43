"""An answered outbound call on which no one speaks: the agent speaks first.

A person who answers says "Hello?" and waits for the caller. When that greeting never reached
the model (it came before the agent was listening, or the line swallowed it), or they wait to
be spoken to, both sides wait on each other in silence until one hangs up. So if neither the
called party (the model heard speech) nor the agent (a reply began) has spoken for a while
after the answer, the agent says something: the dial request's greeting, or ``PROMPT``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from duplex_agent.agent.protocol import events as p

#: How long an answered call may stay silent before the agent speaks: a person who said "Hello?"
#: and heard nothing says it again after a few seconds.
DEFAULT_QUIET_ANSWER_S = 4.0
#: What the agent says into a silent line when the request gives no greeting.
PROMPT = "Hello? Can you hear me?"


class QuietLine:
    """Watches a call's conversation events for anyone speaking; ``quiet_for`` waits on them."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._spoken_at: float | None = None
        self._changed = asyncio.Event()

    def observe(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SpeechStarted | p.ResponseCreated):
            self._spoken_at = self._clock()
            self._changed.set()

    async def quiet_for(self, seconds: float, *, since: float) -> bool:
        """True once no one has spoken from ``since`` (the clock's time) to ``since + seconds``;
        False as soon as someone speaks in that time (or spoke since ``since`` already)."""
        deadline = since + seconds
        while True:
            if self._spoken_at is not None and self._spoken_at >= since:
                return False
            left = deadline - self._clock()
            if left <= 0:
                return True
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # the wait is over: checked above
                await asyncio.wait_for(self._changed.wait(), left)
