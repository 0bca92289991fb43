"""A function tool's schema on the wire, from livekit-agents' own schema builder.

The wire carries tools flat, as vLLM-Omni and OpenAI Realtime do: ``{"type": "function", "name",
"description", "parameters"}``; livekit-agents builds that shape for its Responses-style providers
(``internally_tagged``). A raw tool brings its schema whole.
"""

from __future__ import annotations

from typing import Any

from livekit.agents import llm

AnyFunctionTool = llm.FunctionTool | llm.RawFunctionTool


def tool_name(tool: AnyFunctionTool) -> str:
    return tool.info.name


def wire_schema(tool: AnyFunctionTool) -> dict[str, Any]:
    if isinstance(tool, llm.RawFunctionTool):
        raw = tool.info.raw_schema
        return {"type": "function", "name": raw["name"], "description": raw.get("description") or "",
                "parameters": raw.get("parameters", {"type": "object", "properties": {}})}
    schema = llm.utils.build_legacy_openai_schema(tool, internally_tagged=True)
    schema["description"] = schema["description"].strip()  # a docstring's own line ends stay out of the prompt
    return schema
