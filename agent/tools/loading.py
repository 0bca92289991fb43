"""``--tools package.module``: the function tools a module declares, checked at start-up.

Every livekit-agents function tool the module holds at its top level is taken (``@function_tool``,
or ``@function_tool(raw_schema=...)``), with the module's optional ``instructions`` string. A
module that does not import, holds no tool, or holds one the worker cannot serve stops the start
with a ``ToolModuleError`` naming the module and what is wrong, before any model loads.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any

from livekit.agents import llm

from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.agent.protocol.events import ProtocolError
from duplex_agent.agent.protocol.tools import check_tools
from duplex_agent.agent.tools.schemas import AnyFunctionTool, tool_name, wire_schema


class ToolModuleError(ModelStartError):
    """``--tools`` names a module the worker cannot serve tools from; the message says why."""


@dataclass(frozen=True, slots=True)
class ToolModule:
    name: str
    tools: tuple[AnyFunctionTool, ...]
    #: The module's ``instructions``: what the model is told about its tools ("" when it has none).
    instructions: str
    #: Each tool's schema as the wire carries it, checked as a session.update's would be.
    schemas: tuple[dict[str, Any], ...]


def load_tool_module(name: str) -> ToolModule:
    where = f"--tools {name!r}"
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise ToolModuleError(f"{where}: not a module name (package.module)")
    # A module beside the user, as `python -m` finds it: the console script's own folder is
    # what Python puts first on the path, not the folder it was started from.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise ToolModuleError(f"{where}: the module does not import: {type(exc).__name__}: {exc}") from exc
    tools = _tools_of(module)
    if not tools:
        raise ToolModuleError(f"{where}: the module holds no function tools (async functions under "
                              "livekit.agents' @function_tool, at its top level)")
    for tool in tools:
        if not inspect.iscoroutinefunction(inspect.unwrap(tool)):
            raise ToolModuleError(f"{where}: the tool {tool_name(tool)!r} is not an async function: tools run in the "
                                  "call's event loop, where a blocking one would stop the call's audio (write "
                                  "`async def`, and await asyncio.to_thread(...) for blocking work)")
    instructions = getattr(module, "instructions", "")
    if not isinstance(instructions, str):
        raise ToolModuleError(f"{where}: `instructions` must be a string, not {type(instructions).__name__}")
    schemas = []
    for tool in tools:
        try:
            schemas.append(wire_schema(tool))
        except Exception as exc:  # the schema builder's own errors: a parameter type it cannot describe
            raise ToolModuleError(f"{where}: the tool {tool_name(tool)!r} has no JSON schema: {exc}") from exc
    try:
        checked = check_tools(schemas)
    except ProtocolError as exc:
        raise ToolModuleError(f"{where}: {exc}") from None
    return ToolModule(name, tuple(tools), instructions.strip(), tuple(checked))


def _tools_of(module: Any) -> list[AnyFunctionTool]:
    found: dict[int, AnyFunctionTool] = {}
    for value in vars(module).values():
        if isinstance(value, llm.FunctionTool | llm.RawFunctionTool):
            found.setdefault(id(value), value)  # one tool under two names is one tool
    return list(found.values())
