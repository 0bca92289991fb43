"""The session's outgoing events, bounded.

A transport reads events as fast as its client takes them. A client that stops
reading must not make the worker buffer its audio forever: past half the limit
the outbox says so once (``session.lagging`` with stage ``client`` and the
unread audio in ms), and past the limit it is cut off: what is queued is
dropped and only the closing events stay for the client to read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from duplex_agent.agent.protocol import events as p


class EventOutbox:
    def __init__(self, *, max_events: int, max_audio_ms: float, on_overflow: Callable[[], None]) -> None:
        self._max_events = max_events
        self._max_audio_ms = max_audio_ms
        self._on_overflow = on_overflow
        self._items: deque[p.ServerEvent] = deque()
        self._ready = asyncio.Event()
        self._sealed = False
        self._lagging = False
        #: Audio in unread events: milliseconds and bytes.
        self.audio_ms = 0.0
        self.audio_bytes = 0
        #: The most unread audio bytes the outbox ever held.
        self.peak_audio_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, event: p.ServerEvent) -> None:
        if self._sealed:
            return
        self._items.append(event)
        if isinstance(event, p.ResponseAudioDelta):
            self.audio_ms += event.audio_ms
            self.audio_bytes += event.audio.nbytes
            self.peak_audio_bytes = max(self.peak_audio_bytes, self.audio_bytes)
        self._ready.set()
        events, audio_ms = len(self._items), self.audio_ms
        if events > self._max_events or audio_ms > self._max_audio_ms:
            self._on_overflow()
        elif not self._lagging and (2 * events > self._max_events or 2 * audio_ms > self._max_audio_ms):
            self._lagging = True
            self._items.append(p.SessionLagging("client", round(audio_ms, 1)))

    def seal(self, *final: p.ServerEvent) -> None:
        """No more events after ``final``; a reader gets what is queued, then ``final``, then None."""
        if self._sealed:
            return
        self._sealed = True
        self._items.extend(final)
        self._ready.set()

    def cut_off(self, *final: p.ServerEvent) -> None:
        """The reader is too slow: drop every unread event, leave only ``final``."""
        self._items.clear()
        self.audio_ms = 0.0
        self.audio_bytes = 0
        self.seal(*final)

    async def get(self) -> p.ServerEvent | None:
        """The next event; None once sealed and drained. Safe to cancel."""
        while not self._items:
            if self._sealed:
                return None
            self._ready.clear()
            await self._ready.wait()
        event = self._items.popleft()
        if isinstance(event, p.ResponseAudioDelta):
            self.audio_ms -= event.audio_ms
            self.audio_bytes -= event.audio.nbytes
        if self._lagging and 4 * self.audio_ms < self._max_audio_ms and 4 * len(self._items) < self._max_events:
            self._lagging = False  # caught up: a later lag is told again
        return event
