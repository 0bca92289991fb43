"""``ToolContext``: what a tool may ask for by annotating a parameter with it.

livekit-agents hands a ``RunContext`` to every parameter whose annotation is ``RunContext`` or a
subclass of it, and leaves such parameters out of the tool's schema. ``ToolContext`` is such a
subclass, so the same schema builder and argument binder serve our tools, and a tool written for
a LiveKit Agents app (``ctx: RunContext``) runs here too::

    @function_tool
    async def transfer(ctx: ToolContext, to: str) -> str:
        await ctx.control.transfer(to)
        return "transferred"

The worker runs tools at the edge of a call, with no ``AgentSession`` and no ``SpeechHandle``:
asking for those raises ``ToolContextError``, with a sentence saying so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from livekit.agents import RunContext, llm

from duplex_agent.agent.tools.call_control import CallControl
from duplex_agent.agent.tools.call_info import CallInfo


class ToolContextError(RuntimeError):
    """A tool asked its context for something the worker's edge does not have."""


class ToolContext(RunContext[None]):
    def __init__(self, info: CallInfo, function_call: llm.FunctionCall,
                 until_heard: Callable[[], Awaitable[bool]]) -> None:
        # RunContext's own constructor wants an AgentSession and a SpeechHandle, which a call at the
        # worker's edge has none of; nothing of RunContext's state is used here.
        self._info = info
        self._call_made = function_call
        self._until_heard = until_heard

    @property
    def call(self) -> Any:
        """The transport's call: a ``livekit.rtc.Room``, or the direct path's ``PeerSession``."""
        return self._info.call

    @property
    def caller_identity(self) -> str:
        return self._info.caller_identity

    @property
    def control(self) -> CallControl:
        """Hang up, transfer, send DTMF (``CallControlError`` when the call cannot)."""
        return self._info.control

    @property
    def call_id(self) -> str:
        return self._call_made.call_id

    @property
    def function_call(self) -> llm.FunctionCall:
        return self._call_made

    @property
    def session(self) -> Any:
        raise ToolContextError("this tool runs at the duplex-agent worker's edge, which has no AgentSession")

    @property
    def speech_handle(self) -> Any:
        raise ToolContextError("this tool runs at the duplex-agent worker's edge, which has no SpeechHandle")

    @property
    def userdata(self) -> None:
        raise ToolContextError("this tool runs at the duplex-agent worker's edge, which keeps no session userdata")

    def disallow_interruptions(self) -> None:
        """Nothing to do: the worker never cancels a running tool when the caller talks."""

    async def wait_for_playout(self) -> None:
        """Until the caller has heard what the agent said before this call (or talked over it)."""
        await self._until_heard()

    async def heard_before(self) -> bool:
        """Waits as ``wait_for_playout``; False when the caller talked over those words."""
        return await self._until_heard()
