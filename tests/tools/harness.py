"""A call's tool runner with nothing around it: the test plays the conversation's events and the
playout's ends, and reads what the runner sent back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from duplex_agent.agent.protocol.events import (
    ConversationItemAdded,
    ConversationItemCreate,
    ConversationItemDone,
    ResponseAudioDelta,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ServerEvent,
)
from duplex_agent.agent.protocol.tools import function_call_item
from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.agent.tools.edge_runner import EdgeToolRunner
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.toolbox import EdgeToolOptions, ToolBox
from tests.tools import toolkit


def call_events(response_id: str, call_id: str, name: str, arguments: str) -> list[ServerEvent]:
    """A function call as the model side sends it: a response of its own."""
    item_id = f"item-{call_id}"
    opened = function_call_item(item_id, call_id, name, "", status="in_progress")
    item = function_call_item(item_id, call_id, name, arguments)
    return [
        ResponseCreated(response_id, item_id), ConversationItemAdded(opened), ResponseOutputItemAdded(response_id, opened),
        ResponseFunctionCallArgumentsDelta(response_id, item_id, call_id, arguments),
        ResponseFunctionCallArgumentsDone(response_id, item_id, call_id, arguments),
        ResponseOutputItemDone(response_id, item), ConversationItemDone(item), ResponseDone(response_id, "completed"),
    ]


def spoken(response_id: str, *, done: bool = True) -> list[ServerEvent]:
    """A reply with audio (the playout's end is the test's to report)."""
    audio = ResponseAudioDelta(response_id, f"item-{response_id}", np.zeros(240, np.float32), 24000, 0.0, 10.0)
    events: list[ServerEvent] = [ResponseCreated(response_id, f"item-{response_id}"), audio]
    return events + [ResponseDone(response_id, "completed")] if done else events


class FakeControl:
    kind = "direct"

    def __init__(self) -> None:
        self.actions: list[tuple[str, str]] = []

    async def hang_up(self, reason: str) -> None:
        self.actions.append(("hang_up", reason))

    async def transfer(self, to: str) -> None:
        if not to.startswith("tel:"):
            raise CallControlError("needs_phone_call", "a transfer needs a phone call")
        self.actions.append(("transfer", to))

    async def send_dtmf(self, digits: str) -> None:
        self.actions.append(("dtmf", digits))


class FakeHold:
    def __init__(self) -> None:
        self.sounding = False
        self.changes: list[tuple[float, bool]] = []  # (loop time, sounding)

    def start(self) -> None:
        self._set(True)

    def stop(self) -> None:
        self._set(False)

    def _set(self, sounding: bool) -> None:
        if sounding != self.sounding:
            self.sounding = sounding
            self.changes.append((asyncio.get_running_loop().time(), sounding))


class ToolCall:
    """One call's runner over tests/tools/toolkit.py, with its sends, hold and control recorded."""

    def __init__(self, *, replies_to_tool_output: bool = False, timeout_s: float = 10.0,
                 hold_after_s: float = 1.5) -> None:
        self.runs = toolkit.reset()
        box = ToolBox(load_tool_module("tests.tools.toolkit"), EdgeToolOptions(timeout_s, hold_after_s))
        self.control = FakeControl()
        self.hold = FakeHold()
        self.sent: list[Any] = []
        self.runner = EdgeToolRunner(box.for_call(CallInfo("the-room", "alice", self.control)), self.sent.append,
                                     replies_to_tool_output=replies_to_tool_output, hold=self.hold)

    def feed(self, events: list[ServerEvent] | ServerEvent) -> None:
        for event in events if isinstance(events, list) else [events]:
            self.runner.observe(event)

    @staticmethod
    async def settle() -> None:
        """Let every task that can run now run (no time passes)."""
        for _ in range(20):
            await asyncio.sleep(0)

    def outputs(self) -> list[dict[str, Any]]:
        return [e.item for e in self.sent if isinstance(e, ConversationItemCreate)]

    def output_of(self, call_id: str) -> str:
        (item,) = [item for item in self.outputs() if item["call_id"] == call_id]
        return item["output"]

    def error_of(self, call_id: str) -> dict[str, str]:
        return json.loads(self.output_of(call_id))["error"]

    def follow_ups(self) -> int:
        return sum(isinstance(e, ResponseCreate) for e in self.sent)
