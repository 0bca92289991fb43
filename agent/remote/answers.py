"""The answers this side waits for, recognised by the exact ``event_id`` it gave the question.

Some messages this side sends for itself need their answer kept from the transport: a receipt
(``outbox``), the opening barrier and the resume probe (``connection``), the acks sent for the
transport (``self_acks``). Whoever sends one registers its id here with the handler that takes
the answer; the reader hands every server message to ``take`` first.

A server names the message it answers in an ``error`` (``error.event_id``) and, for a
``conversation.item.retrieve``, in the item it returns (``item.id``). Success answers to the
rest carry no id of ours (``session.heartbeat_ack`` is matched by order, in ``outbox``), so an
expectation may never be claimed: only the newest ``limit`` are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

#: Takes the server message that answers an expectation; True when it is handled here, False
#: when it goes on to the transport as well.
OnAnswer = Callable[[dict[str, Any]], bool]


class ExpectedAnswers:
    """Handlers of the answers to messages this side sent, by the exact ``event_id`` of each."""

    def __init__(self, limit: int = 1024) -> None:
        self._handlers: OrderedDict[str, OnAnswer] = OrderedDict()
        self._limit = limit

    def __len__(self) -> int:
        return len(self._handlers)

    def expect(self, event_id: str, on_answer: OnAnswer) -> None:
        """The answer to the message sent as ``event_id`` goes to ``on_answer`` (once)."""
        self._handlers[event_id] = on_answer
        while len(self._handlers) > self._limit:
            self._handlers.popitem(last=False)

    def forget(self, event_id: str) -> None:
        """The message was answered in a way that names no id: stop waiting for it."""
        self._handlers.pop(event_id, None)

    def take(self, data: dict[str, Any]) -> bool:
        """Hand ``data`` to the owner of the message it answers; True when that owner handled it."""
        answered = answered_id(data)
        on_answer = self._handlers.pop(answered, None) if answered is not None else None
        return on_answer is not None and on_answer(data)


def answered_id(data: dict[str, Any]) -> str | None:
    """The ``event_id`` (or retrieved item id) of the client message ``data`` answers, if it names one."""
    kind = data.get("type")
    if kind == "error":
        error = data.get("error")
        answered = error.get("event_id") if isinstance(error, dict) else None
    elif kind == "conversation.item.retrieved":
        item = data.get("item")
        answered = item.get("id") if isinstance(item, dict) else None
    else:
        return None
    return answered if isinstance(answered, str) else None


def error_code(data: dict[str, Any] | None) -> str | None:
    """The code of an ``error`` message (nested, or flat as in a handshake refusal); None for anything else."""
    if not data or data.get("type") != "error":
        return None
    error = data.get("error")
    return str(error.get("code")) if isinstance(error, dict) else str(data.get("code"))
