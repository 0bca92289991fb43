"""A conversation that outlives its backend's host.

``RemoteConversation`` first resumes a dropped session on the same backend. When
that cannot work -- the host refuses the connection or never answers it, the
session expired there, the server has no resume -- the remote conversation ends
lost (``backend_disconnected``; or the server closes it because it is shutting
down), and ``FailoverConversation`` moves the call to
another backend of the pool and goes on:

- the reply that was playing ends as ``failed`` (``backend_lost``): what already
  arrived plays on, nothing more comes of it;
- the new backend gets the transport's session fields, then the history as the
  caller heard it (``HeardHistory``) as ``conversation.item.create`` items with
  their ids, then the caller's input the old backend never confirmed (a question
  asked just after the kill) and what came meanwhile (bounded). Refusals of the
  items stay here: a model that takes no items starts afresh;
- the model's function calls and the transport's outputs are history too, restated in
  their place: a call the edge is still running is known to the new backend when its
  output comes, an output sent before the move goes over once (never again as carried
  input), and the new backend's echoes of them stay here, so no call is announced twice;
- the transport sees none of the new session's handshake.

The caller hears a gap, never a hang-up. With no backend left the transport is
told (``error`` ``backend_unavailable``); if none takes the call within
``lost_grace_s`` it ends (``session.closed`` ``backend_lost``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from duplex_agent.agent import metrics
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.conversation import RemoteConversation
from duplex_agent.agent.remote.function_calls import function_item
from duplex_agent.agent.remote.self_acks import real_time_heard_ms
from duplex_agent.agent.session.ledger import TextMark, text_heard_by
from duplex_agent.agent.session.ports import AdmissionError, Conversation
from duplex_agent.agent.session.responses import item_text
from duplex_agent.plugins.contract import DuplexCapabilities

log = logging.getLogger("duplex_agent.remote")

#: ``event_id`` prefix of the history items a new backend is given; errors answering them stay here.
_HISTORY = "evt_history"
#: Client events kept for the next backend (about 10 s of 20 ms appends).
_HELD_EVENTS = 500
#: What a new backend is given again: the caller's input, not what addressed the old backend's replies.
_CARRIED = (p.InputAudioBufferAppend, p.InputAudioBufferCommit, p.InputAudioBufferClear, p.ResponseCreate,
            p.ConversationItemCreate)
#: Server events that prove the input sent before them arrived.
_RECEIPTS = (p.InputAudioBufferCommitted, p.ResponseCreated, p.InputAudioBufferCleared)
#: ``session.closed`` reasons of a backend that is going away (draining): its calls move too.
_HOST_GOING = frozenset({"shutdown", "shutting_down"})
#: How often a call with no backend left looks for one again.
_RETRY_S = 0.5


@dataclass(slots=True)
class _Item:
    role: str
    text: str = ""
    #: Assistant audio: its text marks, how much arrived, when the first arrived, what was acknowledged.
    marks: list[TextMark] = field(default_factory=list)
    received_ms: float = 0.0
    first_at: float | None = None
    heard_ms: float | None = None
    done: bool = False

    #: A function call or its output, restated as it is (the other items are words), and for a
    #: call whether its arguments came whole (a call cut off before that was never run).
    wire: dict[str, Any] | None = None
    whole: bool = False

    def heard_text(self, now: float) -> str:
        """The words heard (the ledger's ``text_heard_by``) by the ack, else by the time the audio had to play."""
        if self.role != "assistant" or not self.marks:
            return self.text
        heard = self.heard_ms
        if heard is None:
            heard = self.received_ms if self.first_at is None else real_time_heard_ms(self.received_ms,
                                                                                       self.first_at, now)
        return text_heard_by(self.marks, heard)


class HeardHistory:
    """The conversation so far as the caller heard it, from the events both ways (the newest ``limit`` items)."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._items: OrderedDict[str, _Item] = OrderedDict()
        self._responses: dict[str, str] = {}  # response -> its assistant item

    def _add(self, item_id: str, item: _Item) -> None:
        self._items[item_id] = item
        while len(self._items) > self.limit:
            self._items.popitem(last=False)
        while len(self._responses) > self.limit:
            del self._responses[next(iter(self._responses))]

    def _reply(self, response_id: str) -> _Item | None:
        return self._items.get(self._responses.get(response_id, ""))

    def server_event(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.InputAudioBufferCommitted) and event.item_id not in self._items:
            self._add(event.item_id, _Item("user"))  # in turn order; its words come with the transcript
        elif isinstance(event, p.InputTranscriptionCompleted):
            if event.item_id not in self._items:
                self._add(event.item_id, _Item("user"))
            self._items[event.item_id].text = event.transcript.strip()
        elif isinstance(event, p.ConversationItemCreated):
            item_id = event.item.get("id")
            if isinstance(item_id, str) and item_id not in self._items:
                self._add(item_id, _Item(str(event.item.get("role", "user")), item_text(event.item)))
        elif isinstance(event, p.ResponseCreated):
            self._responses[event.response_id] = event.item_id
            self._add(event.item_id, _Item("assistant"))
        elif (item := self._reply(getattr(event, "response_id", "") or "")) is not None:
            if isinstance(event, p.ResponseAudioDelta):
                item.first_at = time.monotonic() if item.first_at is None else item.first_at
                item.received_ms = max(item.received_ms, event.audio_start_ms + event.audio_ms)
                item.marks.extend(TextMark(str(m["text"]), float(m["start_ms"]), float(m["end_ms"]))
                                  for m in event.marks)
            elif isinstance(event, p.ResponseTranscriptDelta):
                item.text += event.delta
            elif isinstance(event, p.ResponseTranscriptDone):
                item.text = event.transcript
            elif isinstance(event, p.ResponseDone):
                item.done = True
        self._function_call_event(event)
        if isinstance(event, p.ConversationItemDeleted):
            self._items.pop(event.item_id, None)
        elif isinstance(event, p.ConversationItemTruncated) and event.item_id in self._items:
            self._items[event.item_id].heard_ms = event.audio_end_ms

    def _function_call_event(self, event: p.ServerEvent) -> None:
        """A call is history once its arguments are whole: from then on the edge may run it."""
        if isinstance(event, p.ConversationItemAdded | p.ConversationItemDone) and \
                (call := function_item(event.item)) is not None:
            known = self._items.get(str(call["id"]))
            if known is None:
                known = _Item("function_call", wire=_restated_call(call))
                self._add(str(call["id"]), known)
            elif known.wire is None:  # its response's ``response.created`` named it as the reply's item
                known.role, known.wire = "function_call", _restated_call(call)
            if isinstance(event, p.ConversationItemDone):
                known.whole = True
                known.wire = _restated_call(call)
        elif isinstance(event, p.ResponseFunctionCallArgumentsDone) and \
                (known := self._items.get(event.item_id)) is not None and known.wire is not None:
            known.wire["arguments"] = event.arguments
            known.whole = True

    def client_event(self, event: p.ClientEvent) -> None:
        if isinstance(event, p.ConversationItemCreate) and is_output(event):
            output = dict(event.item)
            item_id = str(output.setdefault("id", f"item_output_{uuid.uuid4().hex[:12]}"))
            self._add(item_id, _Item("function_call_output", wire=output))
        if isinstance(event, p.PlaybackAck):
            item = self._items.get(event.item_id or "") or self._reply(event.response_id or "")
            if item is not None:
                item.heard_ms = event.played_ms

    def unfinished_replies(self) -> list[str]:
        return [response_id for response_id, item_id in self._responses.items()
                if item_id in self._items and not self._items[item_id].done]

    def items(self) -> list[dict[str, Any]]:
        """The history as conversation items (assistant words only as far as they were heard)."""
        now = time.monotonic()
        out = []
        for item_id, item in self._items.items():
            if item.wire is not None:
                if item.whole or item.role != "function_call":
                    out.append(item.wire)
                continue
            text = item.heard_text(now).strip()
            if text:
                kind = "text" if item.role == "assistant" else "input_text"
                out.append({"id": item_id, "type": "message", "role": item.role,
                            "content": [{"type": kind, "text": text}]})
        return out


class Placement(Protocol):
    """Where a moving call finds its next backend (``agent.remote.pool.BackendPool``)."""

    async def place(self) -> tuple[Any, RemoteConversation]:
        """(the backend, a conversation on it); AdmissionError when none takes one."""

    def lost(self, member: Any, reason: str | None = None) -> None:
        """A conversation on ``member`` was lost with its host (``reason``: why, when known)."""


def is_output(event: p.ClientEvent) -> bool:
    """A transport's ``function_call_output``: history restates it, so it is never carried as input."""
    return isinstance(event, p.ConversationItemCreate) and event.item.get("type") == "function_call_output"


def _restated_call(call: dict[str, Any]) -> dict[str, Any]:
    return {key: call[key] for key in ("id", "type", "call_id", "name", "arguments") if key in call} | \
        {"status": "completed"}


def _keep(events: deque[p.ClientEvent], event: p.ClientEvent) -> None:
    """Append within the bound; the oldest audio goes first."""
    events.append(event)
    if len(events) > _HELD_EVENTS:
        appends = [n for n, kept in enumerate(events) if isinstance(kept, p.InputAudioBufferAppend)]
        del events[appends[0] if appends else 0]


class FailoverConversation(Conversation):
    """A ``Conversation`` on a pool of backends; one ``RemoteConversation`` at a time, moved when its host is lost."""

    def __init__(self, pool: Placement, member: Any, conversation: RemoteConversation, *,
                 lost_grace_s: float) -> None:
        self._pool = pool
        self._member = member
        self._current = conversation
        self.lost_grace_s = lost_grace_s
        self._session_id = conversation.session_id
        self._caps = conversation.capabilities
        self.history = HeardHistory()
        self._session: dict[str, Any] = {}  # every session field the transport has set
        self._held: deque[p.ClientEvent] | None = None  # while moving: what the next backend gets
        self._unconfirmed: deque[p.ClientEvent] = deque()  # input sent since the backend last proved receipt
        self._replayed: set[str] = set()  # history items given to the new backend, until it echoes them
        self._events: asyncio.Queue[p.ServerEvent | None] = asyncio.Queue()
        self._closing: str | None = None
        self._ended = asyncio.Event()
        self.moves = 0
        self._pump = asyncio.create_task(self._run(), name=f"failover-{self._session_id}")

    # ---- the Conversation interface ----

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self._caps

    @property
    def backend_url(self) -> str:
        return self._member.url

    @property
    def queued_input_ms(self) -> float:
        return self._current.queued_input_ms

    def send(self, event: p.ClientEvent) -> None:
        if self._closing is not None:
            return
        self.history.client_event(event)
        if isinstance(event, p.SessionUpdate):
            self._session.update(event.session)
        if self._held is None:
            self._current.send(event)
        if isinstance(event, _CARRIED):
            _keep(self._unconfirmed if self._held is None else self._held, event)

    async def events(self) -> AsyncIterator[p.ServerEvent]:
        while (event := await self._events.get()) is not None:
            yield event
        self._events.put_nowait(None)  # later readers see the end too

    async def close(self, reason: str = "client_closed") -> None:
        if self._closing is not None:
            await self._ended.wait()
            return
        self._closing = reason
        if self._held is not None:  # moving: there is no conversation to close, only the search
            self._finish(p.SessionClosed(reason))  # before the cancel: the pump's own finish would end the events first
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
            return
        await self._current.close(reason)
        await asyncio.gather(self._pump, return_exceptions=True)

    # ---- relaying and moving ----

    async def _run(self) -> None:
        try:
            while await self._relay(self._current) and self._closing is None:
                if not await self._move():
                    return
        finally:
            self._finish(None)

    async def _relay(self, conversation: RemoteConversation) -> bool:
        """Forward one remote conversation's events; True when it ended lost with its host."""
        lost = False
        async for event in conversation.events():
            if isinstance(event, p.ErrorEvent) and event.code == "backend_disconnected" and self._closing is None:
                lost = True
                continue
            if isinstance(event, p.SessionClosed):
                gone = lost or (event.reason in _HOST_GOING and not conversation.closed_here)
                if gone and self._closing is None:
                    return True
                self._emit(event)
                return False
            if self._answers_move(event):
                continue
            if isinstance(event, _RECEIPTS):
                self._unconfirmed.clear()
            self.history.server_event(event)
            self._emit(event)
        return lost

    async def _move(self) -> bool:
        """Put the call on another backend; False when none took it within the grace (the call has ended)."""
        self._held = deque()
        lost, why = self._member, self._current.lost_reason
        self._pool.lost(lost, why)
        log.info("session %s: backend %s is gone (%s); moving the call", self._session_id, lost.url,
                 why or "its server ended the session")
        for response_id in self.history.unfinished_replies():
            self._emit(p.ResponseDone(response_id, "failed", "backend_lost"))
            self.history.server_event(p.ResponseDone(response_id, "failed", "backend_lost"))
        give_up_at = time.monotonic() + self.lost_grace_s
        told = False
        while True:
            try:
                member, conversation = await self._pool.place()
                break
            except AdmissionError as exc:
                if exc.code == "shutting_down":
                    self._emit(p.ErrorEvent.of("shutting_down", str(exc), error_type="server_error"))
                    self._emit(p.SessionClosed("shutting_down"))
                    return False
                if not told:
                    told = True
                    self._emit(p.ErrorEvent.of(
                        "backend_unavailable", f"the call's backend is gone and no other takes it ({exc}); "
                        f"still looking for {self.lost_grace_s:g} s", error_type="server_error"))
                left = give_up_at - time.monotonic()
                if left <= 0:
                    self._emit(p.SessionClosed("backend_lost"))
                    return False
                await asyncio.sleep(min(_RETRY_S, left))
        conversation.send(p.SessionUpdate(dict(self._session)))
        items = self.history.items()
        self._replayed = {item["id"] for item in items}
        for n, item in enumerate(items):
            conversation.send(p.ConversationItemCreate(item, event_id=f"{_HISTORY}_{n}"))
        carried = [event for event in (*self._unconfirmed, *self._held) if not is_output(event)]
        self._unconfirmed.clear()
        self._held = None
        for event in carried:
            conversation.send(event)
            _keep(self._unconfirmed, event)
        self._current, self._member = conversation, member
        self.moves += 1
        metrics.BACKEND_FAILOVERS.inc()
        log.info("session %s: the call goes on on %s (%d history items)", self._session_id, member.url, len(items))
        return True

    def _answers_move(self, event: p.ServerEvent) -> bool:
        """The new backend's answers to what a move sent it: its handshake, the items' echoes and refusals."""
        if isinstance(event, p.SessionCreated):
            return self.moves > 0  # the transport's session exists already; this one is the new backend's
        if isinstance(event, p.ConversationItemCreated) and event.item.get("id") in self._replayed:
            self._replayed.discard(str(event.item["id"]))
            return True
        if isinstance(event, p.ConversationItemAdded | p.ConversationItemDone) and event.item.get("id") in self._replayed:
            return True  # vLLM-Omni's echoes of a restated call or output
        return isinstance(event, p.ErrorEvent) and str(event.error.get("event_id") or "").startswith(_HISTORY)

    def _emit(self, event: p.ServerEvent) -> None:
        if not self._ended.is_set():
            self._events.put_nowait(event)

    def _finish(self, closed: p.SessionClosed | None) -> None:
        if self._ended.is_set():
            return
        if closed is not None:
            self._events.put_nowait(closed)
        self._events.put_nowait(None)
        self._ended.set()
