"""The worker's tools (one ``--tools`` module) and, bound to a call, what the edge runner uses.

``ToolBox`` is loaded once at start-up and shared by every call; ``for_call`` gives a call its
``CallTools``: the same tools, each run with a ``ToolContext`` for that call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from livekit.agents import llm

from duplex_agent.agent.tools.arguments import bind_arguments
from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.agent.tools.context import ToolContext
from duplex_agent.agent.tools.loading import ToolModule
from duplex_agent.agent.tools.markers import is_after_heard
from duplex_agent.agent.tools.outcomes import TOOL_ERROR, TOOL_FAILED, UNKNOWN_TOOL, ToolAnswer, ToolCallRefused
from duplex_agent.agent.tools.schemas import AnyFunctionTool, tool_name

#: A tool's run may take this long before the model is told it timed out (``--tool-timeout``).
DEFAULT_TIMEOUT_S = 10.0
#: A call still unanswered this long has the hold sound play until the answer is heard (``--hold-after``).
DEFAULT_HOLD_AFTER_S = 1.5


@dataclass(frozen=True, slots=True)
class EdgeToolOptions:
    timeout_s: float = DEFAULT_TIMEOUT_S
    hold_after_s: float = DEFAULT_HOLD_AFTER_S

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"the tool timeout must be a positive number of seconds, not {self.timeout_s!r}")
        if not self.hold_after_s >= 0:
            raise ValueError(f"the hold delay must be 0 or more seconds, not {self.hold_after_s!r}")


class ToolBox:
    def __init__(self, module: ToolModule, options: EdgeToolOptions | None = None) -> None:
        self.module = module
        self.options = options or EdgeToolOptions()
        self._tools = {tool_name(tool): tool for tool in module.tools}

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [dict(schema) for schema in self.module.schemas]

    @property
    def instructions(self) -> str:
        return self.module.instructions

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def tool(self, name: str) -> AnyFunctionTool | None:
        return self._tools.get(name)

    def for_call(self, info: CallInfo) -> CallTools:
        return CallTools(self, info)


class CallTools:
    """One call's tools: what the edge runner asks of them."""

    def __init__(self, box: ToolBox, info: CallInfo) -> None:
        self.box = box
        self.info = info

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return self.box.schemas

    @property
    def instructions(self) -> str:
        return self.box.instructions

    @property
    def timeout_s(self) -> float:
        return self.box.options.timeout_s

    @property
    def hold_after_s(self) -> float:
        return self.box.options.hold_after_s

    def knows(self, name: str) -> bool:
        return self.box.tool(name) is not None

    def after_heard(self, name: str) -> bool:
        return is_after_heard(self.box.tool(name))

    def prepare(self, name: str, call_id: str, arguments: str,
                until_heard: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[ToolAnswer]]:
        """The call, ready to run; ToolCallRefused now when the tool is unknown or the arguments do not fit."""
        tool = self.box.tool(name)
        if tool is None:
            raise ToolCallRefused(UNKNOWN_TOOL, f"there is no tool {name!r}; the tools are "
                                  f"{', '.join(sorted(self.box.names))}")
        context = ToolContext(self.info, llm.FunctionCall(call_id=call_id, name=name, arguments=arguments),
                              until_heard)
        args, kwargs = bind_arguments(tool, arguments, context)

        async def run() -> ToolAnswer:
            try:
                result = await tool(*args, **kwargs)
            except llm.ToolError as exc:
                raise ToolCallRefused(TOOL_ERROR, exc.message) from None
            except CallControlError as exc:  # the call cannot do it: its code and sentence are for the model
                raise ToolCallRefused(exc.code, str(exc)) from None
            except llm.StopResponse:
                return ToolAnswer("", reply_required=False)
            return answer_of(name, result)

        return run


def answer_of(name: str, result: Any) -> ToolAnswer:
    """A tool's return value as the output the model reads: text as it is, anything else as JSON."""
    reply_required = True
    if isinstance(result, llm.ToolResult):
        reply_required = result.reply_required
        result = result.output
    if result is None:
        return ToolAnswer("", reply_required)
    if isinstance(result, str):
        return ToolAnswer(result, reply_required)
    try:
        return ToolAnswer(json.dumps(result), reply_required)
    except (TypeError, ValueError):
        raise ToolCallRefused(TOOL_FAILED, f"{name} returned an answer that is neither text nor JSON") from None
