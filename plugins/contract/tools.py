"""Where a session's tools reach a plugin: vLLM-Omni's keys in ``DuplexSessionConfig.extra_body``.

``session.update``'s ``tools`` and ``tool_choice`` arrive checked, in the realtime wire's flat
shape (``{"type": "function", "name", "description", "parameters"}``), under ``REALTIME_TOOLS`` and
``REALTIME_TOOL_CHOICE``; one ``response.create``'s own go under the ``REALTIME_RESPONSE_*`` keys
(the ``response_options`` the runner gives a plugin).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REALTIME_TOOLS = "realtime_tools"
REALTIME_TOOL_CHOICE = "realtime_tool_choice"
REALTIME_RESPONSE_TOOLS = "realtime_response_tools"
REALTIME_RESPONSE_TOOL_CHOICE = "realtime_response_tool_choice"


def tools_in_effect(extra_body: Mapping[str, object],
                    response_options: Mapping[str, object] | None = None) -> tuple[list[dict[str, Any]],
                                                                                   str | dict[str, Any]]:
    """The tools and tool choice one response uses: its ``response.create``'s own where it gave
    them, else the session's (``auto`` when none was chosen)."""
    options = response_options or {}
    tools = options.get(REALTIME_RESPONSE_TOOLS, extra_body.get(REALTIME_TOOLS))
    choice = options.get(REALTIME_RESPONSE_TOOL_CHOICE, extra_body.get(REALTIME_TOOL_CHOICE))
    return (list(tools) if isinstance(tools, list) else [],
            choice if isinstance(choice, str | dict) else "auto")
