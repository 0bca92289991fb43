"""One remote conversation's function calls: each announced once, a bounded number per reply,
each transport output recognised when a resume sends it again.

vLLM-Omni announces a model's call as a response of its own: ``response.created``,
``conversation.item.added`` (the ``function_call`` item), ``response.output_item.added``, the
arguments' ``delta`` and ``done``, ``response.output_item.done``, ``conversation.item.done``,
``response.done``. ``ServerMessageReader`` names the call on its ``response.created``
(``function_call``), so ``screen`` knows at once whether a response is a call, and passes the
whole call on to the transport, or none of it:

- a ``call_id`` announced before (a replay, a server that says it twice) is not announced again;
- beyond ``MAX_CALLS_PER_REPLY`` calls in one reply (until the caller's next turn or the model's
  next spoken reply) a call is kept from the transport, and the model is answered for it with an
  error output, so its history has an answer for every call it made.

A transport's ``function_call_output`` goes out with an item id and an ``event_id`` (its own, or
ours when it gave none). The outbox may send it again after a resume; when the first copy had
arrived, the server refuses the second (vLLM-Omni: ``invalid_function_call_output``). That refusal
answers a message the transport sent once, so it stays here; every other answer goes on, with the
transport's own ``event_id``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY, error_output, function_call_output_item
from duplex_agent.agent.remote.answers import ExpectedAnswers, error_code
from duplex_agent.agent.remote.responses import RecentIds

log = logging.getLogger("duplex_agent.remote")

REFUSED_CALL_CODE = "too_many_function_calls"


def function_item(item: Any, kind: str = "function_call") -> dict[str, Any] | None:
    """``item`` when it is a realtime item of type ``kind`` with an id, else None."""
    if isinstance(item, dict) and item.get("type") == kind and isinstance(item.get("id"), str):
        return item
    return None


class FunctionCalls:
    """The calls the server announced and the outputs sent for them, for one conversation.

    ``send`` queues a message of this side's own for the server (the error outputs of refused calls).
    """

    def __init__(self, answers: ExpectedAnswers, send: Callable[[dict[str, Any]], object], *,
                 max_per_reply: int = MAX_CALLS_PER_REPLY) -> None:
        self._answers = answers
        self._send = send
        self.max_per_reply = max_per_reply
        self._announced = RecentIds()  # call ids passed on to the transport
        self._kept = RecentIds()  # responses and items of calls kept from the transport
        self._accepted = RecentIds()  # ids of outputs the server took
        self._own_outputs = RecentIds()  # items of this side's error outputs
        self._in_reply = 0
        self._sent = 0
        #: Calls kept from the transport because their reply had made enough already.
        self.refused = 0

    # ---- server -> transport ----

    def screen(self, events: list[p.ServerEvent]) -> list[p.ServerEvent]:
        """``events`` (what one server message completed) without the calls the transport must not see."""
        passed: list[p.ServerEvent] = []
        for event in events:
            if isinstance(event, p.ResponseCreated):
                call = function_item(event.function_call)
                if call is None:
                    self._in_reply = 0  # the model speaks: its next calls are another reply's
                elif not self._admit(event.response_id, call):
                    continue
            elif isinstance(event, p.InputAudioBufferCommitted):
                self._in_reply = 0
            if not self._kept_event(event):
                passed.append(event)
        return passed

    def _admit(self, response_id: str, call: dict[str, Any]) -> bool:
        call_id = str(call.get("call_id", ""))
        if call_id in self._announced:
            log.info("the server announced call %s again; the transport has it already", call_id)
        elif self._in_reply >= self.max_per_reply:
            self.refused += 1
            log.warning("call %s (%s) refused: the reply made %d calls already", call_id, call.get("name"),
                        self._in_reply)
            self._answer_refused(call_id)
        else:
            self._in_reply += 1
            self._announced.add(call_id)
            return True
        self._kept.add(response_id)
        self._kept.add(str(call["id"]))
        return False

    def _kept_event(self, event: p.ServerEvent) -> bool:
        """An event of a call kept from the transport, or the echo of this side's own output."""
        if getattr(event, "response_id", None) in self._kept:
            return True
        if isinstance(event, p.ConversationItemAdded | p.ConversationItemDone | p.ConversationItemCreated):
            item_id = event.item.get("id")
            if isinstance(event, p.ConversationItemAdded) and function_item(event.item, "function_call_output"):
                self._accepted.add(str(item_id))
            return item_id in self._kept or item_id in self._own_outputs
        return False

    def _answer_refused(self, call_id: str) -> None:
        item_id = f"item_refused_{uuid.uuid4().hex[:12]}"
        self._own_outputs.add(item_id)
        output = error_output(REFUSED_CALL_CODE, f"at most {self.max_per_reply} function calls per reply; "
                              "this one was not run")
        self._send({"type": "conversation.item.create", "event_id": self._own_event_id(self._own_refused),
                    "item": function_call_output_item(call_id, output, item_id=item_id)})

    # ---- transport -> server ----

    def output(self, event: p.ConversationItemCreate) -> dict[str, Any]:
        """The wire message for a transport's ``function_call_output`` (as it is, plus the ids it lacks)."""
        item = dict(event.item)
        item_id = item.setdefault("id", f"item_output_{uuid.uuid4().hex[:12]}")
        message: dict[str, Any] = {"type": event.type, "item": item}
        if event.previous_item_id is not None:
            message["previous_item_id"] = event.previous_item_id
        given = event.event_id

        def answered(error: dict[str, Any]) -> bool:
            if error_code(error) == "invalid_function_call_output" and item_id in self._accepted:
                log.info("output %s sent again after a resume: the server had it already", item_id)
                return True
            if given is None and isinstance(error.get("error"), dict):
                error["error"]["event_id"] = None  # the transport named no event
            return False

        message["event_id"] = given if given is not None else self._own_event_id(answered)
        if given is not None:
            self._answers.expect(given, answered)
        return message

    def _own_event_id(self, on_answer: Callable[[dict[str, Any]], bool]) -> str:
        self._sent += 1
        event_id = f"evt_call_{self._sent}"
        self._answers.expect(event_id, on_answer)
        return event_id

    @staticmethod
    def _own_refused(error: dict[str, Any]) -> bool:
        log.info("the server refused an error output for a refused call: %s", error_code(error))
        return True
