"""A model's function calls, and the client's outputs for them.

A call the data plane projects becomes a response of its own, announced in the order
vLLM-Omni 0.30.0 announces one: ``response.created``, the call's item added and created,
``response.output_item.added``, its arguments (one delta, then done),
``response.output_item.done``, ``conversation.item.done``, ``response.done``. All of it in
one mailbox step, so a barge-in can cancel the reply that made the call but never a call
once announced. One reply announces at most ``MAX_CALLS_PER_REPLY`` calls.

A client's ``function_call_output`` (``conversation.item.create``) is checked as vLLM-Omni
checks it: a call the conversation holds, a string output, one output per call. The plugin
may patch its runtime config for it, or refuse it (``runtime_config_for_function_output``).
Accepted, it enters the history and is announced like any item. The model answers it by
itself when it ``replies_to_tool_output`` (once no call waits for its output); otherwise the
client's ``response.create`` asks for that answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY, announced_item, function_call_item
from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.responses import ActiveResponse, HistoryItem, ResponseManager

log = logging.getLogger("duplex_agent.runner")

FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
#: Item types this module keeps (a client may seed the conversation with a call of its own, too).
FUNCTION_ITEM_TYPES = (FUNCTION_CALL, FUNCTION_CALL_OUTPUT)


class FunctionCalls:
    def __init__(self, core: SessionCore, responses: ResponseManager) -> None:
        self._core = core
        self._responses = responses
        #: Calls made outside any response (a continuous model that calls before it speaks), per fence.
        self._loose_calls: tuple[tuple[int, int], int] = ((-1, -1), 0)

    # ---- the model's calls ----

    def announce(self, projected: Mapping[str, object], reply: ActiveResponse | None) -> None:
        """A ``function_call.done`` the data plane projected: announce it as a response of its own."""
        core = self._core
        name = projected.get("name")
        if not isinstance(name, str) or not name.strip():
            log.warning("session %s: the model made a function call without a name; it is not announced",
                        core.session_id)
            return
        if self._count_call(reply) > MAX_CALLS_PER_REPLY:
            log.warning("session %s: the model made more than %d function calls in one reply; %r is not announced",
                        core.session_id, MAX_CALLS_PER_REPLY, name)
            return
        arguments = _arguments_text(projected.get("arguments"))
        call_id = projected.get("call_id")
        if not isinstance(call_id, str) or not call_id or self._call(call_id) is not None:
            # Outputs are matched by call id: each call needs its own.
            call_id = core.new_id("call")
        response_id, item_id = core.new_id("resp"), core.new_id("item")
        item = function_call_item(item_id, call_id, name, arguments)
        previous = self._responses.remember(HistoryItem(item_id, FUNCTION_CALL, function=item))
        emit = core.emit
        emit(p.ResponseCreated(response_id, item_id, function_call=dict(item)))
        emit(p.ConversationItemAdded(dict(item), previous))
        emit(p.ConversationItemCreated(dict(item), previous))
        emit(p.ResponseOutputItemAdded(response_id, dict(item)))
        emit(p.ResponseFunctionCallArgumentsDelta(response_id, item_id, call_id, arguments))
        emit(p.ResponseFunctionCallArgumentsDone(response_id, item_id, call_id, arguments))
        emit(p.ResponseOutputItemDone(response_id, dict(item)))
        emit(p.ConversationItemDone(dict(item), previous))
        emit(p.ResponseDone(response_id, "completed", "completed", function_call=dict(item)))

    def _count_call(self, reply: ActiveResponse | None) -> int:
        """This call's number within its reply."""
        if reply is not None:
            reply.calls_made += 1
            return reply.calls_made
        fence = (self._core.epoch, self._core.turn_id)
        made = self._loose_calls[1] + 1 if self._loose_calls[0] == fence else 1
        self._loose_calls = (fence, made)
        return made

    # ---- the client's items ----

    def item_create(self, command: p.ConversationItemCreate) -> None:
        """A ``function_call_output`` (checked, then answered) or a client's own ``function_call``."""
        item = command.item
        given = item.get("id")
        kept = announced_item(item, given if isinstance(given, str) and given else self._core.new_id("item"))
        item_id = str(kept["id"])
        if kept["type"] == FUNCTION_CALL_OUTPUT:
            self._check_output(kept, command.event_id)
            patch = self._core.plugin.runtime_config_for_function_output(
                self._core.config, dict(self._core.runtime_config), dict(kept))
            if patch is not None:
                self._core.runtime_config = dict(patch)
        previous = self._responses.remember(HistoryItem(item_id, str(kept["type"]), function=kept))
        emit = self._core.emit
        emit(p.ConversationItemAdded(dict(kept), previous))
        emit(p.ConversationItemCreated(dict(kept), previous))
        emit(p.ConversationItemDone(dict(kept), previous))
        if kept["type"] == FUNCTION_CALL_OUTPUT:
            self._answered()

    def _check_output(self, item: Mapping[str, Any], event_id: str | None) -> None:
        """vLLM-Omni's checks of a ``function_call_output``, its codes and messages (``invalid_function_call_output``)."""
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id or self._call(call_id) is None:
            raise p.ProtocolError("invalid_function_call_output",
                                  "function_call_output requires the call_id of a completed function call",
                                  event_id=event_id, param="item.call_id")
        output = item.get("output")
        if not isinstance(output, str):
            raise p.ProtocolError("invalid_function_call_output", "function_call_output requires a string output",
                                  event_id=event_id, param="item.output")
        if self._output(call_id) is not None:
            raise p.ProtocolError("invalid_function_call_output",
                                  f"function_call_output already exists for call_id {call_id}",
                                  event_id=event_id, param="item.output")

    def _answered(self) -> None:
        responses = self._responses
        responses.unanswered_outputs += 1
        if self._core.capabilities.replies_to_tool_output and not self.waiting_calls():
            responses.request_continuation({}, None)
            responses.start_next_turn()

    # ---- what the conversation holds ----

    def waiting_calls(self) -> list[str]:
        """Call ids in the conversation with no output yet."""
        answered = {i.function.get("call_id") for i in self._responses.history
                    if i.function is not None and i.function.get("type") == FUNCTION_CALL_OUTPUT}
        return [str(i.function.get("call_id")) for i in self._responses.history
                if i.function is not None and i.function.get("type") == FUNCTION_CALL
                and i.function.get("call_id") not in answered]

    def _call(self, call_id: str) -> HistoryItem | None:
        return self._find(FUNCTION_CALL, call_id)

    def _output(self, call_id: str) -> HistoryItem | None:
        return self._find(FUNCTION_CALL_OUTPUT, call_id)

    def _find(self, kind: str, call_id: str) -> HistoryItem | None:
        return next((i for i in self._responses.history if i.function is not None
                     and i.function.get("type") == kind and i.function.get("call_id") == call_id), None)


def _arguments_text(arguments: object) -> str:
    """A call's arguments as the wire carries them: JSON text (a call without arguments takes none)."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments)
    except (TypeError, ValueError):
        return str(arguments)
