"""Tools on the wire, as vLLM-Omni 0.30.0 carries them, and their checks.

A session's tools come in ``session.update`` (``tools``, ``tool_choice``) and go where
vLLM-Omni puts them, in ``extra_body`` (``realtime_tools``, ``realtime_tool_choice``), so a
plugin reads them the way vLLM-Omni's plugins do. A model's call travels as a
``function_call`` item in a response of its own; its answer comes back as a
``function_call_output`` item in ``conversation.item.create``.
"""

from __future__ import annotations

import json
from typing import Any

from duplex_agent.agent.protocol.events import ProtocolError
from duplex_agent.plugins.contract.say import MAX_SAY_CHARS, RESPONSE_SAY
from duplex_agent.plugins.contract.tools import (
    REALTIME_RESPONSE_TOOL_CHOICE,
    REALTIME_RESPONSE_TOOLS,
    REALTIME_TOOL_CHOICE,
    REALTIME_TOOLS,
)

#: Where ``session.update``'s fields live in ``extra_body`` (vLLM-Omni's keys; the contract names them).
TOOLS_KEY = REALTIME_TOOLS
TOOL_CHOICE_KEY = REALTIME_TOOL_CHOICE
#: Where one ``response.create``'s own ``tools`` / ``tool_choice`` go (vLLM-Omni's response options).
RESPONSE_TOOLS_KEY = REALTIME_RESPONSE_TOOLS
RESPONSE_TOOL_CHOICE_KEY = REALTIME_RESPONSE_TOOL_CHOICE
#: Tools one session may declare: more would not fit a speech model's prompt anyway.
MAX_TOOLS = 64
#: Function calls one reply may make; the runner announces no more (a runaway model would
#: otherwise flood the client with calls it has to run).
MAX_CALLS_PER_REPLY = 8
TOOL_CHOICES = ("auto", "none", "required")


def check_tools(value: Any, *, event_id: str | None = None) -> list[dict[str, Any]]:
    """``tools`` as the wire gives them (flat ``{"type": "function", "name", "parameters"}`` or the
    chat API's nested ``{"type": "function", "function": {...}}``), checked; raises ``invalid_tools``."""
    if not isinstance(value, list):
        raise ProtocolError("invalid_tools", "tools must be a list of function definitions", event_id=event_id)
    if len(value) > MAX_TOOLS:
        raise ProtocolError("invalid_tools", f"at most {MAX_TOOLS} tools per session", event_id=event_id)
    checked: list[dict[str, Any]] = []
    names: set[str] = set()
    for index, tool in enumerate(value):
        definition = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(definition, dict) or (isinstance(tool, dict) and tool.get("type", "function") != "function"):
            raise ProtocolError("invalid_tools", f"tool {index} must be an object of type 'function'",
                                event_id=event_id)
        name = definition.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ProtocolError("invalid_tools", f"tool {index} needs a name", event_id=event_id)
        if name in names:
            raise ProtocolError("invalid_tools", f"tool {name!r} is declared twice", event_id=event_id)
        parameters = definition.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ProtocolError("invalid_tools", f"tool {name!r}: parameters must be a JSON schema of type 'object'",
                                event_id=event_id)
        names.add(name)
        checked.append({"type": "function", "name": name, "description": str(definition.get("description") or ""),
                        "parameters": parameters})
    return checked


def check_tool_choice(value: Any, *, event_id: str | None = None) -> str | dict[str, Any]:
    """``auto``, ``none``, ``required`` or ``{"type": "function", "name": ...}``; raises ``invalid_tool_choice``."""
    if isinstance(value, str) and value in TOOL_CHOICES:
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name", (value.get("function") or {}).get("name") if isinstance(value.get("function"), dict)
                         else None)
        if isinstance(name, str) and name:
            return {"type": "function", "name": name}
    raise ProtocolError("invalid_tool_choice", f"tool_choice must be one of {list(TOOL_CHOICES)} or "
                        "{'type': 'function', 'name': ...}", event_id=event_id)


def response_tool_options(response: Any, *, event_id: str | None = None) -> dict[str, Any]:
    """A ``response.create``'s ``response`` object -> its checked tool options under vLLM-Omni's
    response keys (empty when it names none); raises ``invalid_tools`` / ``invalid_tool_choice``."""
    if not isinstance(response, dict):
        return {}
    options: dict[str, Any] = {}
    if response.get("tools") is not None:
        options[RESPONSE_TOOLS_KEY] = check_tools(response["tools"], event_id=event_id)
    if response.get("tool_choice") is not None:
        options[RESPONSE_TOOL_CHOICE_KEY] = check_tool_choice(response["tool_choice"], event_id=event_id)
    return options


def given_text(response: Any, *, event_id: str | None = None) -> str | None:
    """A ``response.create``'s ``response.say`` (our extra: the text to say word for word), checked;
    None when it has none. Raises ``invalid_field`` for one that is not text or is too long."""
    if not isinstance(response, dict) or response.get(RESPONSE_SAY) is None:
        return None
    text = response[RESPONSE_SAY]
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_SAY_CHARS:
        raise ProtocolError("invalid_field", f"response.say must be text of 1-{MAX_SAY_CHARS} characters",
                            event_id=event_id, param="response.say")
    return text.strip()


def session_tools(extra_body: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's tools (checked when they came in), or none."""
    tools = extra_body.get(TOOLS_KEY)
    return list(tools) if isinstance(tools, list) else []


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, *,
                       status: str = "completed") -> dict[str, Any]:
    """A model's call as the wire's events carry it (vLLM-Omni's ``function_call`` realtime item)."""
    return {"id": item_id, "object": "realtime.item", "type": "function_call", "status": status,
            "name": name, "call_id": call_id, "arguments": arguments}


def announced_item(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """A client's item as the conversation keeps and announces it: vLLM-Omni fills in what the client
    left out (``normalize_conversation_item``: id, object, type, status, an empty content list)."""
    normalized = dict(item)
    normalized["id"] = item_id
    normalized.setdefault("object", "realtime.item")
    normalized.setdefault("type", "message")
    normalized.setdefault("status", "completed")
    if "role" not in normalized and normalized["type"] == "message":
        normalized["role"] = "user"
    if not isinstance(normalized.get("content"), list):
        normalized["content"] = []
    return normalized


def function_call_output_item(call_id: str, output: str, *, item_id: str | None = None) -> dict[str, Any]:
    """A tool's answer, as a client sends it in ``conversation.item.create``."""
    item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id, "output": output}
    if item_id is not None:
        item["id"] = item_id
    return item


def error_output(code: str, message: str) -> str:
    """The ``output`` a model is given when its call could not be run: JSON it can read and say."""
    return json.dumps({"error": {"code": code, "message": message}})
