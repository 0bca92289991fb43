"""When the model is asked to answer its tools' outputs (``response.create``).

livekit-agents asks with ``generate_reply`` once the outputs are in, unless the model replies
to them by itself. A model that does is not asked again: its own reply is the answer. A
caller who is talking when the ask comes (they spoke over the agent while the tool ran) is
not talked over: the ask waits for the end of their turn, which the model then answers
itself, the outputs already in its history; only a session whose turns create no response by
themselves sends the waiting ask once the caller stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from livekit.agents import llm

from duplex_agent.agent.protocol import events as p


class ToolReplies:
    def __init__(self, send: Callable[[p.ClientEvent], None], *, model_replies: Callable[[], bool],
                 turns_create_responses: bool) -> None:
        self._send = send
        self._model_replies = model_replies
        self._turns_create_responses = turns_create_responses
        self._unanswered = 0  # outputs wanting a reply sent since the model last began a response
        self._outputs_since_ask = False
        self._caller_speaking = False
        self._held: p.ResponseCreate | None = None

    def outputs_sent(self, wanting_reply: int) -> None:
        self._unanswered += wanting_reply
        self._outputs_since_ask = True

    def ask(self, instructions: str | None = None) -> None:
        """``generate_reply``: raises ``RealtimeError`` unless tool outputs came since the last ask."""
        if not self._outputs_since_ask:
            raise llm.RealtimeError("a duplex model decides for itself when to speak; it is asked to "
                                    "answer only its tools' outputs")
        self._outputs_since_ask = False
        if not self._unanswered or self._model_replies():
            return  # already answering, or it answers by itself: that reply is the one asked for
        response: dict[str, Any] = {}
        if instructions:
            response["instructions"] = instructions
        create = p.ResponseCreate(response=response or None)
        if self._caller_speaking:
            self._held = create
        else:
            self._send(create)

    @property
    def held(self) -> bool:
        return self._held is not None

    def on_event(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.ResponseCreated):
            self._unanswered = 0
            self._held = None  # the model is answering: whatever it answers, the outputs are in its history
        elif isinstance(event, p.SpeechStarted):
            self._caller_speaking = True
        elif isinstance(event, p.SpeechStopped):
            self._caller_speaking = False
            held, self._held = self._held, None
            if held is not None and not self._turns_create_responses:
                self._send(held)
