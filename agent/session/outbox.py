"""The session's outgoing events, bounded.

A transport reads events as fast as its client takes them, but a model may make
a minute of speech in seconds, so a backlog alone does not mean a client is
gone. The rules:

- past the lag threshold (unread audio or events) the client is told once,
  ``session.lagging`` with stage ``client`` and the unread audio in ms;
- a client past the lag threshold that has read nothing for ``stall_s`` is cut
  off (it stopped reading);
- past the hard cap it is cut off whatever it reads, so memory stays bounded.

Cutting off drops everything unread; only the closing events stay for the client.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.session.limits import SessionLimits


class EventOutbox:
    def __init__(self, limits: SessionLimits, *, clock: Callable[[], float], on_overflow: Callable[[], None]) -> None:
        self._lag_events = limits.lagging_unread_events
        self._lag_audio_ms = limits.lagging_unread_audio_ms
        self._max_events = limits.max_unread_events
        self._max_audio_ms = limits.max_unread_audio_ms
        self._stall_s = limits.client_stall_s
        self._clock = clock
        self._on_overflow = on_overflow
        self._items: deque[p.ServerEvent] = deque()
        self._ready = asyncio.Event()
        self._sealed = False
        self._lagging = False
        self._last_read = clock()
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
        if len(self._items) > self._max_events or self.audio_ms > self._max_audio_ms:
            self._on_overflow()
        elif self._behind():
            if not self._lagging:
                self._lagging = True
                self._items.append(p.SessionLagging("client", round(self.audio_ms, 1)))
            self.check_stall()

    def check_stall(self) -> None:
        """Cut the client off if it is behind and has read nothing for ``stall_s``."""
        if not self._sealed and self._behind() and self._clock() - self._last_read > self._stall_s:
            self._on_overflow()

    def _behind(self) -> bool:
        return len(self._items) > self._lag_events or self.audio_ms > self._lag_audio_ms

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
        self._last_read = self._clock()
        if isinstance(event, p.ResponseAudioDelta):
            self.audio_ms -= event.audio_ms
            self.audio_bytes -= event.audio.nbytes
        if self._lagging and not self._behind():
            self._lagging = False  # caught up: a later lag is told again
        return event
