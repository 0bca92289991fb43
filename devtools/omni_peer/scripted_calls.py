"""The scripted model's tool calls: when it calls, what it calls, and how it answers an output.

In a session with tools (and a ``tool_choice`` other than ``none``), the scripted thinker
answers a caller turn with a call: it says ``reply N checking`` and calls the tool
``tool_choice`` names, else the first one, ``calls_per_reply`` times, with arguments built from
the tool's schema (see ``scripted_arguments``, so a test picks the values through the schema it
declares). A reply to the turn of a call, or to the turn after it, once an output for that call
is in, speaks the outputs instead: ``reply N <output words>``. (vLLM-Omni 0.30.0 answers an
output by itself only for a plugin whose stage request resumes; this one's, Qwen3-Omni's, does
not, and refuses the ``response.create`` after an output for want of new input, so the caller's
next turn is where its answer comes.) The call ids carry their turn (``call_t<N>_<k>_<request>``),
so the thinker knows which turn an output answers without any state of its own.

The thinker writes its calls as one text output between ``CALL_OPEN`` and ``CALL_CLOSE``; the
peer's data plane (``tool_seams``) reads them back into vLLM-Omni's ``function_call`` results.
Pure Python: this module does not import vLLM-Omni.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

#: What the model says in a turn where it calls (one spoken word).
PREAMBLE = "checking"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
#: Keys the peer adds to the thinker's prompt (beside vLLM-Omni's ``prompt``), from the runtime config.
TOOLS_KEY = "scripted_tools"
TOOL_CHOICE_KEY = "scripted_tool_choice"
OUTPUTS_KEY = "scripted_tool_outputs"
CALLS_KEY = "scripted_calls_per_reply"
#: The session ``metadata`` key that sets the calls per reply for one session (else ``--calls-per-reply``).
CALLS_METADATA = "scripted_calls_per_reply"
_CALL_TURN = re.compile(r"^call_t(\d+)_")
_BY_TYPE: dict[str, Any] = {"string": "scripted", "integer": 1, "number": 1, "boolean": True, "array": [],
                            "object": {}}


@dataclass(frozen=True)
class ScriptedCall:
    call_id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, str]:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}


def scripted_arguments(parameters: Any) -> dict[str, Any]:
    """A value for every required property: its ``default``, else its first ``enum`` or ``examples``
    value, else one of its JSON type."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    required = parameters.get("required") if isinstance(parameters.get("required"), list) else []
    arguments: dict[str, Any] = {}
    for name in required:
        schema = properties.get(name) if isinstance(properties.get(name), dict) else {}
        if "default" in schema:
            arguments[name] = schema["default"]
        elif isinstance(schema.get("enum"), list) and schema["enum"]:
            arguments[name] = schema["enum"][0]
        elif isinstance(schema.get("examples"), list) and schema["examples"]:
            arguments[name] = schema["examples"][0]
        else:
            arguments[name] = _BY_TYPE.get(str(schema.get("type")), "scripted")
    return arguments


def _definition(tool: Any) -> dict[str, Any]:
    """A tool's function definition, flat or nested as the chat API nests it."""
    if not isinstance(tool, dict):
        return {}
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def _chosen(tools: list[Any], tool_choice: Any) -> dict[str, Any] | None:
    """The tool the thinker calls, or None when it calls none."""
    definitions = [d for d in map(_definition, tools) if isinstance(d.get("name"), str)]
    if not definitions or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice.get("name") or _definition(tool_choice).get("name")
        return next((d for d in definitions if d["name"] == name), None)
    return definitions[0]


def calls_for_turn(turn: int, tools: Any, tool_choice: Any, *, request_id: str, count: int = 1
                   ) -> list[ScriptedCall]:
    """The calls the thinker makes in caller turn ``turn`` (none when the session asks for none)."""
    tool = _chosen(tools if isinstance(tools, list) else [], tool_choice)
    if tool is None:
        return []
    arguments = json.dumps(scripted_arguments(tool.get("parameters")), separators=(",", ":"))
    suffix = hashlib.sha1(request_id.encode()).hexdigest()[:12]  # one session's call ids are not another's
    return [ScriptedCall(f"call_t{turn}_{k}_{suffix}", str(tool["name"]), arguments) for k in range(max(count, 1))]


def outputs_for_turn(turn: int, outputs: Any) -> list[str]:
    """The outputs given to calls of caller turn ``turn``, in the order they came."""
    found = []
    for entry in outputs if isinstance(outputs, list) else []:
        match = _CALL_TURN.match(str(entry.get("call_id", ""))) if isinstance(entry, dict) else None
        if match and int(match.group(1)) == turn and isinstance(entry.get("output"), str):
            found.append(entry["output"])
    return found


def encode_calls(calls: list[ScriptedCall]) -> str:
    """The thinker's text for its calls."""
    return CALL_OPEN + json.dumps([call.as_dict() for call in calls]) + CALL_CLOSE


def decode_calls(text: str) -> list[ScriptedCall] | None:
    """The calls in a thinker's text, or None when the text is words."""
    if not text.startswith(CALL_OPEN) or not text.endswith(CALL_CLOSE):
        return None
    entries = json.loads(text[len(CALL_OPEN):-len(CALL_CLOSE)])
    return [ScriptedCall(str(e["call_id"]), str(e["name"]), str(e["arguments"])) for e in entries]
