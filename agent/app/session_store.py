"""Realtime sessions that outlive their websocket, as vLLM-Omni's do.

A ``LiveSession`` owns one conversation and the task pumping its events to the
wire. Every event it sends gets a ``server_event_seq`` and goes into a bounded
``ReplayJournal``; ``session.event_ack`` trims it. When the socket drops the
session stays alive for a grace period, still journaling; ``session.resume``
with the session id, the current (single-use, rotating) resume token and the
last seq the client saw reattaches a new socket and replays what it missed.
A journal that outgrows its bound makes replay impossible: the client is told
once with ``session.resync_required`` (``journal_overflow``) and the live socket
keeps being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from duplex_agent.agent import metrics
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
                 journal_bytes: int, resumable: bool, on_closed: Callable[[LiveSession], None]) -> None:
        self.conversation = conversation
        self.session_id = conversation.session_id
        self.resumable = resumable
        self.encoder = ServerWireEncoder(self.session_id, resumable=resumable, fence=conversation.wire_fence)
        self.journal = ReplayJournal(journal_bytes)
        self.input_format = "pcm16"
        self.rates = AppendRateAdapter(conversation.capabilities.input_sample_rate)
        self.ws: web.WebSocketResponse | None = None
        self.generation = 0
        self.session: dict[str, Any] = {}
        self.closed = asyncio.Event()
        self.closing = False  # the client asked to close: a drop now is not a detach
        self._on_closed = on_closed
        self._told_overflow = False
        self._events = events
        self._seq = 0
        self._token_digest = b""
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._grace: asyncio.Task[None] | None = None

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

    async def emit(self, event: p.ServerEvent, *, journal: bool = True, **extra: Any) -> None:
        """Number, journal and send one event to the attached socket (if any)."""
        if isinstance(event, p.ErrorEvent):
            metrics.ERRORS.labels(event.code).inc()
        async with self._lock:
            self._note(event)
            data = self.encoder.encode(event)
            data.update(extra)
            self._seq += 1
            data["server_event_seq"] = self._seq
            text = json.dumps(data, separators=(",", ":"))
            kept = self.journal.record(self._seq, text) if journal else self.journal.skip(self._seq)
            tell_overflow = not kept and self.journal.overflowed and not self._told_overflow
            self._told_overflow = self._told_overflow or tell_overflow
            if self.ws is not None:
                if tell_overflow:
                    await _send_text(self.ws, _dumps(p.SessionResyncRequired(self.session_id, "journal_overflow"),
                                                     self.encoder))
                await _send_text(self.ws, text)

    def _note(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.SessionCreated | p.SessionUpdated):
            self.session = event.session
            self.input_format = str(event.session.get("input_audio_format", self.input_format))
            rate = event.session.get("input_sample_rate")
            if isinstance(rate, int):
                self.rates.configure(rate)

    # ---- attachment ----

    async def attach(self, ws: web.WebSocketResponse, last_seq: int) -> tuple[str, web.WebSocketResponse | None]:
        """Reattach to ``ws`` after ``session.resume``: rotate the token, send ``session.resumed`` and the replay.

        Returns the new token and the socket that was attached before (None when detached).
        Raises JournalGap or ValueError when the replay cannot be complete.
        """
        async with self._lock:
            replay = self.journal.replay_after(last_seq)
            self._cancel_grace()
            token = self.new_token()
            self.generation += 1
            previous, self.ws = self.ws, None
            resumed = p.SessionResumed(self.session_id, self.encoder.encode(p.SessionUpdated(self.session))["session"],
                                       self.generation, token)
            await _send_text(ws, _dumps(resumed, self.encoder))
            for text in replay:
                await _send_text(ws, text)
            self.ws = ws
        return token, previous

    def detach(self, ws: web.WebSocketResponse, grace_s: float,
               on_expired: Callable[[LiveSession], Awaitable[None]]) -> bool:
        """``ws`` dropped: keep the session for ``grace_s`` (False when another socket has it already)."""
        if self.ws is not ws:
            return False
        self.ws = None
        self._cancel_grace()
        self._grace = asyncio.create_task(self._expire_after(grace_s, on_expired), name=f"grace-{self.session_id}")
        return True

    def expire_now(self, on_expired: Callable[[LiveSession], Awaitable[None]]) -> None:
        """End the session as soon as the loop can (not resumable: nobody will come back for it)."""
        self._cancel_grace()
        self._grace = asyncio.create_task(self._expire_after(0.0, on_expired), name=f"end-{self.session_id}")

    async def _expire_after(self, grace_s: float, on_expired: Callable[[LiveSession], Awaitable[None]]) -> None:
        await asyncio.sleep(grace_s)
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
                await self.emit(event)
        finally:
            self.closed.set()
            self._cancel_grace()
            self._on_closed(self)
            ws, self.ws = self.ws, None
            if ws is not None and not ws.closed:
                await ws.close()  # 1000, after session.closed

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
        return None if live is None or live.closed.is_set() else live

    def __len__(self) -> int:
        return len(self._sessions)

    async def close_all(self) -> None:
        await asyncio.gather(*(live.shutdown("shutdown") for live in list(self._sessions.values())),
                             return_exceptions=True)


def _dumps(event: p.ServerEvent, encoder: ServerWireEncoder) -> str:
    """An event outside the numbered stream (resume handshake, resync notice)."""
    return json.dumps(encoder.encode(event), separators=(",", ":"))


async def _send_text(ws: web.WebSocketResponse, text: str) -> None:
    if ws.closed:
        return
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(text)
