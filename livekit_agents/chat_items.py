"""What the model is told of the chat items an ``AgentSession`` adds, as the wire's client events.

Text messages become message items. A tool's output for a call the model made becomes a
``function_call_output`` item, once per call. The model's own calls it already knows. A call
and its output from elsewhere (a history handed over from another agent) cannot go as call
items, which the wire takes only for calls the model itself made, so the model is told of
them in a system message: it keeps what the tool said.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from livekit.agents import llm

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.tools import function_call_output_item
from duplex_agent.livekit_agents.model_calls import ModelCalls

log = logging.getLogger("duplex_agent.livekit_agents")


@dataclass
class ItemEvents:
    """The client events for a batch of items, and the tool outputs among them that want a reply."""

    events: list[p.ClientEvent] = field(default_factory=list)
    outputs_wanting_reply: int = 0


def item_events(items: Iterable[llm.ChatItem], calls: ModelCalls) -> ItemEvents:
    """Raises ``RealtimeError`` for an item a duplex model cannot take (an image, a handoff...)."""
    out = ItemEvents()
    for item in items:
        if isinstance(item, llm.ChatMessage) and item.role in ("user", "assistant", "system"):
            if item.text_content:
                out.events.append(_message(item.role, item.text_content))
        elif isinstance(item, llm.FunctionCall):
            if not calls.made(item.call_id):
                out.events.append(_message("system", f"The tool {item.name} was called with {item.arguments}."))
        elif isinstance(item, llm.FunctionCallOutput):
            if calls.made(item.call_id):
                if calls.answer(item.call_id):
                    out.events.append(p.ConversationItemCreate(item=function_call_output_item(item.call_id,
                                                                                              item.output)))
                    out.outputs_wanting_reply += item.reply_required
                else:  # the wire refuses a second answer; the first stands
                    log.warning("a second output for the call %s is not sent", item.call_id)
            else:
                kind = "failed" if item.is_error else "returned"
                out.events.append(_message("system", f"The tool {item.name or item.call_id} {kind}: {item.output}"))
        else:
            raise llm.RealtimeError(f"a duplex model takes text messages and tool outputs only, not {item.type}")
    return out


def _message(role: str, text: str) -> p.ConversationItemCreate:
    kind = "output_text" if role == "assistant" else "input_text"
    return p.ConversationItemCreate(item={"type": "message", "role": role, "content": [{"type": kind, "text": text}]})
