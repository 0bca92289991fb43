"""The agent's transcript deltas, joined and sent at most every 250 ms.

A reply's text arrives a word at a time, about ten deltas a second. Each one sent is a
data-channel message (direct) or a text-stream write through livekit's FFI (LiveKit),
so both transports hold deltas back and send one per response per period. Any other
event flushes what is held first, so a transport's output keeps the conversation's order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from duplex_agent.agent.protocol.events import ResponseTranscriptDelta

#: Transcript deltas of one response are joined and sent at most this often.
TRANSCRIPT_FLUSH_S = 0.25


class TranscriptDeltas:
    """Holds deltas back and hands them to ``send`` joined, per response, once a period."""

    def __init__(self, send: Callable[[ResponseTranscriptDelta], None], *, period_s: float = TRANSCRIPT_FLUSH_S) -> None:
        self._send = send
        self._period_s = period_s
        self._held: list[ResponseTranscriptDelta] = []
        self._timer: asyncio.TimerHandle | None = None
        self._last_sent_at = float("-inf")

    def hold(self, event: ResponseTranscriptDelta) -> None:
        last = self._held[-1] if self._held else None
        if last is not None and (last.response_id, last.item_id) == (event.response_id, event.item_id):
            self._held[-1] = ResponseTranscriptDelta(event.response_id, event.item_id, last.delta + event.delta)
        else:
            self._held.append(event)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            wait = max(0.0, self._last_sent_at + self._period_s - loop.time())
            self._timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        """Send what is held now (before any other event goes out)."""
        self.cancel()
        if not self._held:
            return
        held, self._held = self._held, []
        self._last_sent_at = asyncio.get_running_loop().time()
        for event in held:
            self._send(event)

    def cancel(self) -> None:
        """Stop the pending flush (what is held stays held)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
