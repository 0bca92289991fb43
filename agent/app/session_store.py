"""Realtime sessions that outlive their websocket, as vLLM-Omni's do.

A ``LiveSession`` owns one conversation and the task pumping its events. Every
event gets a ``server_event_seq`` and goes into a bounded ``ReplayJournal``
(``session.event_ack`` trims it) the moment the model makes it, and on to the
attached socket's ``SocketWriter``, which sends it on a task of its own: the
session never waits on a socket, so a dead one cannot stall it. When the socket
drops (or falls too far behind, see ``socket_writer``) the session stays alive
for a grace period, still journaling; ``session.resume`` with the session id,
the current (single-use, rotating) resume token and the last seq the client saw
reattaches a new socket at once and replays what it missed, then the rest of
the reply follows. A journal that outgrows its bound makes replay impossible:
the client is told once with ``session.resync_required`` (``journal_overflow``)
and the live socket keeps being served.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import WSCloseCode, web

from duplex_agent.agent import metrics
from duplex_agent.agent.app.socket_writer import SocketWriter
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.input_audio import AppendRateAdapter
from duplex_agent.agent.protocol.omni_wire import ServerWireEncoder
from duplex_agent.agent.session.ports import Conversation

log = logging.getLogger("duplex_agent.realtime")


class JournalGap(RuntimeError):
    """The events after the requested seq are no longer all in the journal."""


class ReplayJournal:
    """Encoded server events kept for replay, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: deque[tuple[int, str]] = deque()
        self._bytes = 0
        self._forgotten_through = 0  # every seq up to here was acknowledged or lost
        self.head = 0
        self.overflowed = False

    def record(self, seq: int, text: str) -> bool:
        """Keep one event; False once the bound is exceeded (from then on replay is impossible)."""
        self.head = seq
        if self.overflowed:
            return False
        size = len(text.encode())
        if self._bytes + size > self.max_bytes:
            self.overflowed = True
            self._entries.clear()
            self._bytes = 0
            return False
        self._entries.append((seq, text))
        self._bytes += size
        return True

    def skip(self, seq: int) -> bool:
        """An event sent but not kept for replay (the ``session.created`` that carries the token)."""
        self.head = seq
        return False

    def acknowledge(self, seq: int) -> None:
        if seq > self.head:
            raise ValueError(f"server_event_seq {seq} is newer than the last event sent ({self.head})")
        while self._entries and self._entries[0][0] <= seq:
            _, text = self._entries.popleft()
            self._bytes -= len(text.encode())
        self._forgotten_through = max(self._forgotten_through, seq)

    def replay_after(self, seq: int) -> list[str]:
        if seq > self.head:
            raise ValueError(f"last_received_server_event_seq {seq} is newer than the last event sent ({self.head})")
        if self.overflowed or seq < self._forgotten_through:
            raise JournalGap(f"the events after {seq} are no longer all kept")
        return [text for entry_seq, text in self._entries if entry_seq > seq]


class LiveSession:
    """One conversation on this endpoint, attached to at most one websocket at a time."""

    def __init__(self, conversation: Conversation, events: AsyncIterator[p.ServerEvent], *,
                 journal_bytes: int, socket_backlog_bytes: int, resumable: bool,
                 on_closed: Callable[[LiveSession], None]) -> None:
        self.conversation = conversation
        self.session_id = conversation.session_id
        self.resumable = resumable
        self.encoder = ServerWireEncoder(self.session_id, resumable=resumable, fence=conversation.wire_fence)
        self.journal = ReplayJournal(journal_bytes)
        self.input_format = "pcm16"
        self.rates = AppendRateAdapter(conversation.capabilities.input_sample_rate)
        #: The attached socket's writer; None while detached.
        self.writer: SocketWriter | None = None
        self.max_backlog_bytes = socket_backlog_bytes
        self.generation = 0
        self.session: dict[str, Any] = {}
        self.closed = asyncio.Event()
        self.closing = False  # the client asked to close: a drop now is not a detach
        self.ending = False  # the conversation ended: the last events are being sent
        self._on_closed = on_closed
        self._told_overflow = False
        self._events = events
        self._seq = 0
        self._token_digest = b""
        self._retiring: set[SocketWriter] = set()  # writers of sockets this session left, ending
        self._pump: asyncio.Task[None] | None = None
        self._grace: asyncio.Task[None] | None = None
        self._grace_s = 0.0
        self._on_expired: Callable[[LiveSession], Awaitable[None]] | None = None

    @property
    def ws(self) -> web.WebSocketResponse | None:
        """The attached socket (None while detached)."""
        return self.writer.ws if self.writer is not None else None

    # ---- tokens ----

    def new_token(self) -> str:
        """A fresh resume token; the previous one stops working."""
        token = secrets.token_urlsafe(32)
        self._token_digest = hashlib.sha256(token.encode()).digest()
        return token

    def token_matches(self, token: str) -> bool:
        return bool(self._token_digest) and hmac.compare_digest(self._token_digest,
                                                                hashlib.sha256(token.encode()).digest())

    # ---- sending ----

    def emit(self, event: p.ServerEvent, *, journal: bool = True, **extra: Any) -> None:
        """Number and journal one event, and queue it for the attached socket (if any); never waits."""
        if isinstance(event, p.ErrorEvent):
            metrics.ERRORS.labels(event.code).inc()
        self._note(event)
        data = self.encoder.encode(event)
        data.update(extra)
        self._seq += 1
        data["server_event_seq"] = self._seq
        text = json.dumps(data, separators=(",", ":"))
        kept = self.journal.record(self._seq, text) if journal else self.journal.skip(self._seq)
        tell_overflow = not kept and self.journal.overflowed and not self._told_overflow
        if self.writer is not None:
            if tell_overflow:
                self._told_overflow = True
                self.writer.put(_dumps(p.SessionResyncRequired(self.session_id, "journal_overflow"), self.encoder))
            self.writer.put(text, event.audio_ms if isinstance(event, p.ResponseAudioDelta) else 0.0)

    def _note(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SessionCreated | p.SessionUpdated):
            self.session = event.session
            self.input_format = str(event.session.get("input_audio_format", self.input_format))
            rate = event.session.get("input_sample_rate")
            if isinstance(rate, int):
                self.rates.configure(rate)

    # ---- attachment ----

    def attach_first(self, ws: web.WebSocketResponse, abort: Callable[[], None], *, grace_s: float,
                     on_expired: Callable[[LiveSession], Awaitable[None]]) -> None:
        """The socket that opened the session. A socket that drops leaves the session waiting ``grace_s``
        for a resume (0: ended at once); ``on_expired`` ends it when nobody came."""
        self._grace_s = grace_s
        self._on_expired = on_expired
        self.generation = 1
        self.writer = self._writer(ws, abort)

    def attach(self, ws: web.WebSocketResponse, abort: Callable[[], None], last_seq: int) -> str:
        """Reattach to ``ws`` after ``session.resume``: rotate the token, queue ``session.resumed`` and
        the replay, and end the socket that was attached before (told ``session.replaced``).

        Returns the new token. Raises JournalGap or ValueError when the replay cannot be complete.
        """
        replay = self.journal.replay_after(last_seq)
        self._cancel_grace()
        token = self.new_token()
        self.generation += 1
        resumed = p.SessionResumed(self.session_id, self.encoder.encode(p.SessionUpdated(self.session))["session"],
                                   self.generation, token)
        previous, self.writer = self.writer, self._writer(ws, abort, first=(_dumps(resumed, self.encoder), *replay))
        if previous is not None:
            # What it still had queued is in the replay; it only learns why it was let go.
            previous.end(_dumps(p.SessionReplaced(self.session_id, self.generation - 1), self.encoder),
                         drop_queued=True)
            self._retire(previous)
        return token

    def detach(self, ws: web.WebSocketResponse) -> bool:
        """``ws`` dropped: keep the session for the grace (False when another socket has it already)."""
        if self.writer is None or self.writer.ws is not ws:
            return False
        writer, self.writer = self.writer, None
        self._retire(writer, stop=True)
        self._start_grace(self._grace_s)
        return True

    def _writer(self, ws: web.WebSocketResponse, abort: Callable[[], None], first: tuple[str, ...] = ()) -> SocketWriter:
        return SocketWriter(ws, abort, max_backlog_bytes=self.max_backlog_bytes, on_behind=self._socket_behind,
                            first=first)

    def _socket_behind(self, writer: SocketWriter) -> None:
        """The socket takes events far slower than they come, or not at all: it counts as dropped.

        Its backlog is dropped (the journal has it for a resume) and the session is kept for the grace, as
        for any dropped socket, instead of being held up by it.
        """
        if writer is not self.writer:
            return
        log.warning("session %s: the client took nothing of %.0f kB (%.0f ms of audio) queued for it; ending its "
                    "socket, the session waits for a resume", self.session_id, writer.backlog_bytes / 1000,
                    writer.backlog_audio_ms)
        metrics.ERRORS.labels("client_too_slow").inc()
        lagging = _dumps(p.SessionLagging("client", round(writer.backlog_audio_ms, 1)), self.encoder)
        writer.end(lagging, drop_queued=True, close_code=WSCloseCode.POLICY_VIOLATION)
        self.writer = None
        self._retire(writer)
        self._start_grace(self._grace_s)

    def _retire(self, writer: SocketWriter, *, stop: bool = False) -> None:
        """Keep ``writer`` until it has ended its socket (``stop``: at once)."""
        self._retiring.add(writer)
        ending = asyncio.create_task(writer.stop() if stop else writer.wait(), name=f"retire-{self.session_id}")
        ending.add_done_callback(lambda _task: self._retiring.discard(writer))

    def _start_grace(self, grace_s: float) -> None:
        """Wait ``grace_s`` for a resume, then end the session."""
        self._cancel_grace()
        if self.ending or self._on_expired is None:
            return
        self._grace = asyncio.create_task(self._expire_after(grace_s, self._on_expired),
                                          name=f"grace-{self.session_id}")

    async def _expire_after(self, grace_s: float, on_expired: Callable[[LiveSession], Awaitable[None]]) -> None:
        await asyncio.sleep(grace_s)
        if grace_s:
            log.info("session %s: nobody resumed it within %g s", self.session_id, grace_s)
        await on_expired(self)

    def _cancel_grace(self) -> None:
        if self._grace is not None and self._grace is not asyncio.current_task():
            self._grace.cancel()
        self._grace = None

    # ---- lifecycle ----

    def start_pump(self) -> None:
        self._pump = asyncio.create_task(self._run_pump(), name=f"pump-{self.session_id}")

    async def _run_pump(self) -> None:
        try:
            async for event in self._events:
                self.emit(event)
                # A model's burst would otherwise all queue before the writer sends any of it.
                await asyncio.sleep(0)
        finally:
            self.ending = True
            self._cancel_grace()
            self._on_closed(self)
            writer, self.writer = self.writer, None
            if writer is not None:
                writer.end()  # what is queued, session.closed last, then close 1000
                await writer.wait()
            await asyncio.gather(*(w.wait() for w in list(self._retiring)), return_exceptions=True)
            self.closed.set()

    async def shutdown(self, reason: str) -> None:
        self._cancel_grace()
        await self.conversation.close(reason)
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)


class SessionStore:
    """The endpoint's live sessions by id."""

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}

    def add(self, live: LiveSession) -> None:
        self._sessions[live.session_id] = live

    def forget(self, live: LiveSession) -> None:
        if self._sessions.get(live.session_id) is live:
            del self._sessions[live.session_id]

    def get(self, session_id: str) -> LiveSession | None:
        live = self._sessions.get(session_id)
        return None if live is None or live.ending or live.closed.is_set() else live

    def __len__(self) -> int:
        return len(self._sessions)

    async def close_all(self) -> None:
        await asyncio.gather(*(live.shutdown("shutdown") for live in list(self._sessions.values())),
                             return_exceptions=True)


def _dumps(event: p.ServerEvent, encoder: ServerWireEncoder) -> str:
    """An event outside the numbered stream (resume handshake, resync and lag notices)."""
    return json.dumps(encoder.encode(event), separators=(",", ":"))
