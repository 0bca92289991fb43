"""The response manager: which response is speaking, the turns waiting for one,
the conversation history, and the cancel sequence.

A response opens for the oldest committed turn once the one before it is done.
Cancelling advances the epoch and aborts the old epoch's requests. Playback
acknowledgements and truncations cut an assistant item to what was heard, and
at each turn boundary the model keeps only those words, and the function calls
and outputs between them, in order.

A response may also answer from the context alone (a *continuation*: the model's
answer to function outputs). It waits for the floor like a turn, and while the
caller speaks; a turn's reply that opens first answers the outputs too, and the
continuation is dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.session_config import session_config_dict
from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.ledger import ResponseLedger
from duplex_agent.plugins.contract import DuplexAppendPlan, DuplexFence

log = logging.getLogger("duplex_agent.runner")


@dataclass(slots=True)
class HistoryItem:
    item_id: str
    #: user, assistant or system; a function item's type (``function_call``, ``function_call_output``).
    role: str
    text: str = ""
    ledger: ResponseLedger | None = None
    committed_to_model: bool = False
    #: A function item as the conversation announced it (None for a message).
    function: dict[str, Any] | None = None

    @property
    def heard_text(self) -> str:
        return self.ledger.heard_text() if self.ledger is not None else self.text


@dataclass(slots=True)
class ActiveResponse:
    response_id: str
    item_id: str
    turn_id: int
    fence: DuplexFence
    ledger: ResponseLedger
    request_ids: set[str] = field(default_factory=set)
    spoke: bool = False
    audio_done: bool = False
    #: The conversation item before this response's own (its user turn, usually).
    previous_item_id: str | None = None
    #: It answers from the context alone (function outputs), not a user turn.
    continuation: bool = False
    #: Its ``response.create``'s own options (tools, tool choice), under vLLM-Omni's response keys.
    options: dict[str, Any] = field(default_factory=dict)
    #: Function calls the model made in this reply, announced or not (the reply's bound counts them all).
    calls_made: int = 0


@dataclass(frozen=True, slots=True)
class Continuation:
    """A response asked for that answers from the context alone, waiting for the floor."""

    #: The ``response.create``'s own options (none when the model answers by itself).
    options: dict[str, Any]
    #: The ``response.create`` that asked for it (errors name it).
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ContinuationDue:
    """Mailbox command: a continuation's response is open; submit its plan and read its outputs."""

    response: ActiveResponse
    plan: DuplexAppendPlan
    event_id: None = None


#: Turns whose user item a late transcript can still find.
_TURNS_REMEMBERED = 16

#: Watch a stage request's outputs: (request id, stage id, the response it serves or None).
WatchRequest = Callable[[str, int, "ActiveResponse | None"], None]


def realtime_item(item_id: str, role: str, status: str, content: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """A conversation item as the wire's events carry it (vLLM-Omni's ``realtime.item``)."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": role, "status": status,
            "content": content}


def item_text(item: dict[str, Any]) -> str:
    """The words of a client's conversation item: its parts' text (or transcripts), joined."""
    parts = given if isinstance(given := item.get("content"), list) else []
    return " ".join(str(part.get("text") or part.get("transcript") or "") for part in parts
                    if isinstance(part, dict)).strip()


class ResponseManager:
    def __init__(self, core: SessionCore) -> None:
        self._core = core
        #: Set by the runner once the stage router exists (the router needs this manager first).
        self.watch: WatchRequest | None = None
        self.active: ActiveResponse | None = None
        self.last: ActiveResponse | None = None
        #: Committed user turns whose input is closed, waiting for their response: (turn, item, request).
        self.pending_turns: deque[tuple[int, str, str]] = deque()
        self.history: list[HistoryItem] = []
        self._user_items_by_turn: dict[int, str] = {}
        #: The client plays the audio itself (the realtime websocket): see ``response_cancel``.
        self.client_plays_out = False
        #: Function outputs accepted since a response last opened: something the model has not answered.
        self.unanswered_outputs = 0
        #: A continuation asked for and not yet opened.
        self.continuation: Continuation | None = None
        #: Texts to say (``response.say``) not yet opened, in the order asked.
        self.says: deque[Continuation] = deque()
        #: Options a ``response.create`` gave the reply of a turn that waits for the floor: turn -> options.
        self._turn_options: dict[int, dict[str, Any]] = {}

    # ---- turns ----

    def add_user_item(self, item_id: str) -> str | None:
        """A user item enters history; returns the item before it, if any."""
        previous = self.history[-1].item_id if self.history else None
        self._remember(HistoryItem(item_id, "user"))
        return previous

    def commit_user_item(self, item_id: str) -> None:
        """A committed user turn enters history, announced as vLLM-Omni does (added, created, committed, done)."""
        previous = self.add_user_item(item_id)
        item = realtime_item(item_id, "user", "completed", [{"type": "input_audio", "transcript": ""}])
        emit = self._core.emit
        emit(p.ConversationItemAdded(item, previous))
        emit(p.ConversationItemCreated(item, previous))
        emit(p.InputAudioBufferCommitted(item_id, previous, len(self.history)))
        emit(p.ConversationItemDone(item, previous))

    def queue_turn(self, turn_id: int, item_id: str, request_id: str) -> None:
        self.pending_turns.append((turn_id, item_id, request_id))

    def give_next_turn_options(self, options: dict[str, Any]) -> None:
        """A ``response.create``'s own options, for the reply of the oldest waiting turn."""
        if options and self.pending_turns:
            self._turn_options[self.pending_turns[0][0]] = options

    def request_continuation(self, options: dict[str, Any], event_id: str | None) -> None:
        """Ask for a response that answers from the context alone; it opens when the floor is free.
        A second request before it opens replaces the first's options."""
        self.continuation = Continuation(options, event_id)

    def request_say(self, options: dict[str, Any], event_id: str | None) -> None:
        """Ask for a response that says a given text (in ``options``); it opens after the turns and
        the continuation waiting, when the floor is free."""
        self.says.append(Continuation(options, event_id))

    def start_next_turn(self) -> None:
        """Open the response of the oldest waiting turn, else a continuation asked for, else a text
        to say, unless a response is running."""
        if self.active is not None:
            return
        if not self.pending_turns:
            # While the caller speaks the answer waits: their turn's reply will answer the outputs too.
            waiting = self.continuation or (self.says[0] if self.says else None)
            if waiting is not None and not self._core.state.speech_since_commit:
                if waiting is not self.continuation:
                    self.says.popleft()
                self._open_continuation(waiting)
            return
        turn_id, item_id, request_id = self.pending_turns.popleft()
        # This reply has the function outputs so far in its context: it answers them too.
        self.continuation = None
        self.unanswered_outputs = 0
        self.commit_model_context()
        self._core.turn_id = turn_id
        response = self.open(turn_id, options=self._turn_options.pop(turn_id, None))
        response.request_ids.add(request_id)
        self._user_items_by_turn[turn_id] = item_id
        while len(self._user_items_by_turn) > _TURNS_REMEMBERED:
            del self._user_items_by_turn[next(iter(self._user_items_by_turn))]
        assert self.watch is not None
        self.watch(request_id, 0, response)

    def _open_continuation(self, continuation: Continuation) -> None:
        """Open the continuation's response and hand its plan to the mailbox (the submit awaits)."""
        if continuation is self.continuation:
            self.continuation = None
            self.unanswered_outputs = 0
        self.commit_model_context()
        core = self._core
        request_id = f"{core.session_id}-t{core.turn_id}-cont-{core.next_serial()}"
        try:
            plan = core.plugin.plan_response_continuation(
                request_id=request_id,
                fence=core.fence,
                session_config=session_config_dict(core.config),
                runtime_config=dict(core.runtime_config),
                turn_seq=core.turn_id,
                response_options=dict(continuation.options),
                sampling_params=core.sampling,
            )
        except Exception as exc:
            log.exception("session %s: planning a continuation failed", core.session_id)
            core.error("plugin_error", f"the model plugin failed to continue: {type(exc).__name__}: {exc}",
                       continuation.event_id, error_type="server_error")
            return
        if plan is None:
            core.error("response_continuation_unsupported",
                       f"the model {core.capabilities.plugin_id!r} cannot answer without new input",
                       continuation.event_id)
            return
        response = self.open(core.turn_id, options=continuation.options, continuation=True)
        response.request_ids.add(plan.request_id)
        core.post(ContinuationDue(response, plan))

    def remember(self, item: HistoryItem) -> str | None:
        """Add an item to history; returns the item before it, if any."""
        previous = self.history[-1].item_id if self.history else None
        self._remember(item)
        return previous

    def _remember(self, item: HistoryItem) -> None:
        """Add to history, dropping the oldest items the model already has in its context."""
        history = self.history
        history.append(item)
        excess = len(history) - self._core.limits.max_history_items
        while excess > 0 and (history[0].role == "user" or history[0].committed_to_model):
            del history[0]
            excess -= 1

    def user_transcript(self, turn_id: int, transcript: str) -> None:
        item_id = self._user_items_by_turn.get(turn_id)
        item = next((i for i in self.history if i.item_id == item_id), None)
        if item is not None:
            item.text = transcript
        self._core.emit(p.InputTranscriptionCompleted(item_id or self._core.new_id("item"), transcript))

    def withdraw_unanswered_turn(self) -> bool:
        """When the running response has said nothing yet (nor called a function) and no turn waits behind its own: takes
        that turn's user item out of history (the caller is still saying it; its words come with
        the next turn) and returns True."""
        response = self.active
        if response is None or response.spoke or response.calls_made or response.continuation or self.pending_turns:
            return False
        item_id = self._user_items_by_turn.pop(response.turn_id, None)
        item = next((i for i in self.history if i.item_id == item_id and i.role == "user"), None)
        if item is None:
            return False
        self.history.remove(item)
        self._core.emit(p.ConversationItemDeleted(item.item_id))
        return True

    # ---- one response ----

    def open(self, turn_id: int, *, options: dict[str, Any] | None = None, continuation: bool = False) -> ActiveResponse:
        core = self._core
        response_id = core.new_id("resp")
        item_id = core.new_id("item")
        ledger = ResponseLedger(response_id, item_id)
        response = ActiveResponse(response_id, item_id, turn_id, core.fence, ledger, continuation=continuation,
                                  options=dict(options or {}))
        self.active = response
        self.last = response
        response.previous_item_id = self.history[-1].item_id if self.history else None
        self._remember(HistoryItem(item_id, "assistant", ledger=ledger))
        core.emit(p.ResponseCreated(response_id, item_id))
        # vLLM-Omni's order: the assistant item enters the conversation, then the response's output.
        opened = self._assistant_item(response, "in_progress", None)
        core.emit(p.ConversationItemAdded(opened, response.previous_item_id))
        core.emit(p.ConversationItemCreated(opened, response.previous_item_id))
        core.emit(p.ResponseOutputItemAdded(response_id, opened))
        core.emit(p.ResponseContentPartAdded(response_id, item_id, {"type": "audio", "transcript": ""}))
        return response

    @staticmethod
    def _assistant_item(response: ActiveResponse, status: str, transcript: str | None) -> dict[str, object]:
        content = [] if transcript is None else [{"type": "output_audio", "transcript": transcript}]
        return realtime_item(response.item_id, "assistant", status, content)

    def _close_item(self, response: ActiveResponse, status: str) -> None:
        """vLLM-Omni's order before ``response.done``: the part, the output item, the conversation item."""
        text = response.ledger.full_text()
        emit = self._core.emit
        emit(p.ResponseContentPartDone(response.response_id, response.item_id, {"type": "audio", "transcript": text}))
        item = self._assistant_item(response, status, text)
        emit(p.ResponseOutputItemDone(response.response_id, item))
        emit(p.ConversationItemDone(item, response.previous_item_id))

    def finish(self, response: ActiveResponse, status: str, reason: str = "") -> None:
        if self.active is not response:
            return
        self.active = None
        emit = self._core.emit
        if not response.audio_done and response.ledger.generated_ms > 0:
            response.audio_done = True
            emit(p.ResponseAudioDone(response.response_id, response.item_id))
            emit(p.ResponseTranscriptDone(response.response_id, response.item_id, response.ledger.full_text()))
        self._close_item(response, "completed" if status == "completed" else "incomplete")
        emit(p.ResponseDone(response.response_id, status, reason, audio_ms=response.ledger.sent_ms))
        if status != "cancelled":
            self.start_next_turn()

    async def fail(self, response: ActiveResponse, code: str, message: str) -> None:
        """A stage or the plugin failed this response: tell the client, stop its requests, end it.

        The epoch advances, so outputs still on their way from its requests are dropped.
        """
        core = self._core
        core.error(code, message, None, error_type="server_error")
        stale = core.advance_epoch(response.request_ids, with_input=False)
        try:
            await core.engine.abort(stale)
        except Exception:
            log.exception("session %s: aborting the failed response's requests failed", core.session_id)
        self.finish(response, "failed", code)

    async def cancel(self, reason: str) -> bool:
        """The cancel sequence: epoch + 1, abort the old epoch's requests, tell the client."""
        response = self.active
        if response is None:
            return False
        core = self._core
        stale = core.advance_epoch(response.request_ids, with_input=True)
        self.active = None
        await core.engine.abort(stale)
        for request_id in stale:
            core.plugin.data_plane.close_stream(request_id)
        response.ledger.interrupt()
        if response.ledger.unplayed_ms > 0:  # vLLM-Omni's order: the output is cleared, then the response is done
            core.emit(p.OutputAudioBufferCleared(response.response_id))
        self._close_item(response, "incomplete")
        core.emit(p.ResponseDone(response.response_id, "cancelled", reason, audio_ms=response.ledger.sent_ms))
        return True

    # ---- client commands ----

    async def response_cancel(self, command: p.ResponseCancel) -> None:
        active, last = self.active, self.last
        if active is not None and command.response_id in (None, active.response_id):
            await self.cancel(command.reason)
        elif last is not None and command.response_id in (None, last.response_id):
            if self.client_plays_out:
                # vLLM-Omni's answer (``resolve_cancel_response``): the reply is over, nothing is cleared.
                raise p.ProtocolError("response_not_active", f"Response is already complete: {last.response_id}",
                                      event_id=command.event_id)
            # Generation had finished but its audio may still be playing at the edge: the call path's
            # barge-in (direct WebRTC, LiveKit) names the reply its playout holds.
            last.ledger.interrupt()
            self._core.emit(p.OutputAudioBufferCleared(last.response_id))
        elif command.response_id:
            raise p.ProtocolError("response_not_found", f"no response {command.response_id!r}",
                                  event_id=command.event_id)
        else:
            raise p.ProtocolError("response_cancel_not_active", "no response to cancel", event_id=command.event_id)

    async def barge_in(self) -> None:
        """A hard interrupt from the client: cancel what speaks, or stop what still plays; never an error."""
        if not await self.cancel("barge_in") and self.last is not None:
            self.last.ledger.interrupt()
            self._core.emit(p.OutputAudioBufferCleared(self.last.response_id))

    async def output_clear(self, response_id: str | None = None) -> None:
        """Stop what speaks or plays; the cleared event names it, else the response the client named."""
        target = self.active or self.last
        if not await self.cancel("output_cleared") and target is not None:
            target.ledger.interrupt()
        self._core.emit(p.OutputAudioBufferCleared(target.response_id if target else response_id))

    def truncate(self, command: p.ConversationItemTruncate) -> None:
        item = next((i for i in self.history if i.item_id == command.item_id and i.ledger), None)
        if item is None or item.ledger is None:
            raise p.ProtocolError("item_not_found", f"no assistant item {command.item_id!r}", event_id=command.event_id)
        item.ledger.acknowledge(command.audio_end_ms)
        item.ledger.interrupt()
        self._core.emit(p.ConversationItemTruncated(item.item_id, command.audio_end_ms, command.content_index))

    def playback_ack(self, command: p.PlaybackAck) -> None:
        """Acknowledged playback of the named response (by id or item), else of the latest one."""
        def named(item: HistoryItem) -> bool:
            assert item.ledger is not None
            if command.response_id is not None:
                return item.ledger.response_id == command.response_id
            return command.item_id is None or item.item_id == command.item_id

        item = next((i for i in reversed(self.history) if i.ledger and named(i)), None)
        if item is None and command.response_id is None and command.item_id is None:
            # Nothing was played yet: vLLM-Omni acknowledges an empty cursor.
            empty = {"generated_ms": 0.0, "sent_ms": 0.0, "played_ms": 0.0, "committed_ms": 0.0}
            self._core.emit(p.PlaybackAcknowledged(None, None, 0.0, empty, command.truncate))
            return
        if item is None or item.ledger is None:
            raise p.ProtocolError("playback_item_not_found", f"no response {command.response_id or command.item_id!r}",
                                  event_id=command.event_id)
        ledger = item.ledger
        ledger.acknowledge(command.played_ms)
        if command.truncate:
            ledger.interrupt()
        playback = {"generated_ms": ledger.generated_ms, "sent_ms": ledger.sent_ms, "played_ms": ledger.played_ms,
                    "committed_ms": ledger.committed_ms if ledger.committed_ms is not None else ledger.played_ms}
        self._core.emit(p.PlaybackAcknowledged(ledger.response_id, item.item_id, ledger.played_ms, playback,
                                               command.truncate))

    # ---- conversation items ----

    def item_create(self, command: p.ConversationItemCreate) -> None:
        """A completed item enters history (text turns stay history only: responses come from audio)."""
        item = command.item
        item_id = given if isinstance(given := item.get("id"), str) else self._core.new_id("item")
        role = str(item.get("role", "user"))
        text = item_text(item)
        previous = self.history[-1].item_id if self.history else None
        self.history.append(HistoryItem(item_id, role, text))
        created = self._item_object(self.history[-1])
        self._core.emit(p.ConversationItemAdded(created, previous))
        self._core.emit(p.ConversationItemCreated(created, previous))
        self._core.emit(p.ConversationItemDone(created, previous))

    def item_retrieve(self, command: p.ConversationItemRetrieve) -> None:
        self._core.emit(p.ConversationItemRetrieved(self._item_object(self._item(command.item_id, command.event_id))))

    def item_delete(self, command: p.ConversationItemDelete) -> None:
        item = self._item(command.item_id, command.event_id)
        if self.active is not None and item.ledger is self.active.ledger:
            raise p.ProtocolError("response_already_active", "cannot delete the item of the active response",
                                  event_id=command.event_id)
        self.history.remove(item)
        self._core.emit(p.ConversationItemDeleted(item.item_id))

    def _item(self, item_id: str, event_id: str | None) -> HistoryItem:
        item = next((i for i in self.history if i.item_id == item_id), None)
        if item is None:
            raise p.ProtocolError("item_not_found", f"no item {item_id!r}", event_id=event_id)
        return item

    def _item_object(self, item: HistoryItem) -> dict[str, object]:
        if item.function is not None:
            return dict(item.function)
        part = {"type": "output_audio", "transcript": item.heard_text} if item.ledger is not None \
            else {"type": "input_text", "text": item.text}
        return realtime_item(item.item_id, item.role, "completed", [part])

    def commit_model_context(self) -> None:
        """At a turn boundary, the model keeps only the assistant words the caller heard, and the
        function calls and outputs among them, in conversation order."""
        speaking = self.active.ledger if self.active else None
        plugin, session_id = self._core.plugin, self._core.session_id
        for item in self.history:
            if item.ledger is not None and item.ledger is speaking:
                break  # what follows came after words still being said
            if item.committed_to_model:
                continue
            if item.function is not None:
                item.committed_to_model = True
                plugin.commit_model_function_item(session_id=session_id, item=dict(item.function))
            elif item.role == "assistant":
                item.committed_to_model = True
                plugin.commit_model_context(session_id=session_id, assistant_text=item.heard_text)
