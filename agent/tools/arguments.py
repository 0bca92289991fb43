"""A call's JSON arguments checked and bound to the tool's parameters, or refused.

Strict JSON: livekit-agents' own parser repairs broken JSON, which would run a tool on arguments
the model never wrote; here such a call is refused, and the model, told why, can call again. The
checks and the binding are livekit-agents' (``prepare_function_arguments``: pydantic validation
against the signature, the context handed to the parameter that asks for it). A raw tool has no
signature to check against, so its JSON schema's ``required`` and top-level ``type``s are checked
here.
"""

from __future__ import annotations

import json
from typing import Any

from livekit.agents import llm

from duplex_agent.agent.tools.context import ToolContext
from duplex_agent.agent.tools.outcomes import INVALID_ARGUMENTS, ToolCallRefused
from duplex_agent.agent.tools.schemas import AnyFunctionTool, tool_name

#: What the model is told of a validation error, at most (pydantic's can run long).
MAX_DETAIL = 600
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


def bind_arguments(tool: AnyFunctionTool, arguments: str,
                   context: ToolContext) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments to call ``tool`` with; ToolCallRefused when they do not fit."""
    name = tool_name(tool)
    try:
        values = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ToolCallRefused(INVALID_ARGUMENTS, f"the arguments of {name} are not JSON ({exc})") from None
    if not isinstance(values, dict):
        raise ToolCallRefused(INVALID_ARGUMENTS, f"the arguments of {name} must be a JSON object")
    if isinstance(tool, llm.RawFunctionTool):
        check_raw_arguments(name, tool.info.raw_schema.get("parameters") or {}, values)
    try:
        return llm.utils.prepare_function_arguments(fnc=tool, json_arguments=values, call_ctx=context)
    except llm.ToolError as exc:
        raise ToolCallRefused(INVALID_ARGUMENTS, exc.message[:MAX_DETAIL]) from None


def check_raw_arguments(name: str, parameters: dict[str, Any], values: dict[str, Any]) -> None:
    """``values`` against a raw tool's parameter schema: required keys, top-level types, no
    unknown keys when the schema forbids them."""
    properties = parameters.get("properties") or {}
    missing = [key for key in parameters.get("required") or () if key not in values]
    if missing:
        raise ToolCallRefused(INVALID_ARGUMENTS, f"{name} needs the argument(s) {', '.join(missing)}")
    for key, value in values.items():
        spec = properties.get(key)
        if spec is None:
            if parameters.get("additionalProperties") is False:
                raise ToolCallRefused(INVALID_ARGUMENTS, f"{name} has no argument {key!r}")
            continue
        wanted = spec.get("type") if isinstance(spec, dict) else None
        if wanted is not None and not _has_type(value, [wanted] if isinstance(wanted, str) else list(wanted)):
            raise ToolCallRefused(INVALID_ARGUMENTS, f"the argument {key!r} of {name} must be of type {wanted}")


def _has_type(value: Any, types: list[str]) -> bool:
    for kind in types:
        expected = _JSON_TYPES.get(kind)
        if expected is None:  # a type this check does not know: the tool judges it
            return True
        # JSON has no booleans among its numbers; Python's bool is an int.
        if isinstance(value, expected) and not (isinstance(value, bool) and kind in ("integer", "number")):
            return True
    return False
