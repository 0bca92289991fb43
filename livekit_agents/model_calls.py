"""The function calls a duplex session's model makes, as livekit-agents ``FunctionCall``s.

A call is a response of its own on the wire; its ``response.output_item.done`` carries the
whole call (name, ``call_id``, arguments), and that is where it is handed on. Each ``call_id``
is handed on once, and answered once: a resumed socket may replay what the client missed, and
the wire refuses a second output for one call (``invalid_function_call_output``).
"""

from __future__ import annotations

from livekit.agents import llm

from duplex_agent.agent.protocol import events as p

#: Calls remembered per session; a conversation that made more is long past its first ones.
_KEPT = 1024


class ModelCalls:
    """The calls one session's model made, and which of them have had their output sent."""

    def __init__(self) -> None:
        self._arguments: dict[str, str] = {}  # item -> its arguments, for an item.done that leaves them out
        self._made: dict[str, str] = {}  # call_id -> name, oldest first
        self._answered: set[str] = set()

    def take(self, event: p.ServerEvent) -> llm.FunctionCall | None:
        """The call ``event`` completes, the first time it does; else None."""
        if isinstance(event, p.ResponseFunctionCallArgumentsDone):
            self._arguments[event.item_id] = event.arguments
            return None
        if not isinstance(event, p.ResponseOutputItemDone):
            return None
        item = event.item
        if item.get("type") != "function_call":
            return None
        item_id = str(item.get("id") or "")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            arguments = self._arguments.get(item_id, "{}")
        self._arguments.pop(item_id, None)
        call_id, name = item.get("call_id"), item.get("name")
        # a call cut off before its arguments were whole is not one the model made
        if item.get("status", "completed") != "completed" or not isinstance(call_id, str) or not call_id \
                or not isinstance(name, str) or call_id in self._made:
            return None
        self._made[call_id] = name
        while len(self._made) > _KEPT:
            oldest = next(iter(self._made))
            del self._made[oldest]
            self._answered.discard(oldest)
        call = llm.FunctionCall(call_id=call_id, name=name, arguments=arguments)
        if item_id:
            call.id = item_id  # the session's history and the model's name the call alike
        return call

    def made(self, call_id: str) -> bool:
        return call_id in self._made

    def answer(self, call_id: str) -> bool:
        """Whether an output for ``call_id`` may go to the model now: a call it made, not yet answered."""
        if call_id not in self._made or call_id in self._answered:
            return False
        self._answered.add(call_id)
        return True
