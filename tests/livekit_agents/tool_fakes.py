"""A backend of one scripted conversation, and a model's function call as the wire announces it."""

from __future__ import annotations

import dataclasses
import json

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.tools import function_call_item
from duplex_agent.livekit_agents import DuplexModel
from duplex_agent.plugins.contract import DuplexCapabilities
from tests.webrtc.fakes import CAPS, FakeConversation

TOOL_CAPS = dataclasses.replace(CAPS, plugin_id="fake-tools", supports_tools=True)


class OneConversationBackend:
    """Opens its one ``FakeConversation``; ``known``: whether its model is known before that."""

    def __init__(self, capabilities: DuplexCapabilities = TOOL_CAPS, *, known: bool = True) -> None:
        self.conversation = FakeConversation(capabilities)
        self.known_capabilities = capabilities if known else None
        self.opened = 0

    def tool_facts(self) -> tuple[bool | None, bool | None]:
        known = self.known_capabilities
        return (None, None) if known is None else (known.supports_tools, known.replies_to_tool_output)

    async def open(self) -> FakeConversation:
        self.opened += 1
        return self.conversation

    async def close(self) -> None:
        await self.conversation.close()


def model_on(backend: OneConversationBackend) -> DuplexModel:
    """A DuplexModel whose sessions open on ``backend``."""
    model = DuplexModel.__new__(DuplexModel)
    model._setup(backend, None, name="fake", opening_update={})
    return model


def call_events(call_id: str, name: str, arguments: dict, *, response_id: str = "resp-call") -> list[p.ServerEvent]:
    """A model's function call, a response of its own, in the wire's order."""
    item_id = f"item-{call_id}"
    args = json.dumps(arguments)
    added = function_call_item(item_id, call_id, name, "", status="in_progress")
    done = function_call_item(item_id, call_id, name, args)
    half = len(args) // 2
    return [
        p.ResponseCreated(response_id=response_id, item_id=item_id),
        p.ConversationItemAdded(item=added),
        p.ResponseOutputItemAdded(response_id=response_id, item=added),
        p.ResponseFunctionCallArgumentsDelta(response_id, item_id, call_id, args[:half]),
        p.ResponseFunctionCallArgumentsDelta(response_id, item_id, call_id, args[half:]),
        p.ResponseFunctionCallArgumentsDone(response_id, item_id, call_id, args),
        p.ResponseOutputItemDone(response_id=response_id, item=done),
        p.ConversationItemDone(item=done),
        p.ResponseDone(response_id=response_id, status="completed"),
    ]
