"""Tools at the edge: the functions a model may call during a call, and the call control they act on.

A tool module imports what it needs from here::

    from livekit.agents import function_tool
    from duplex_agent.agent.tools import ToolContext, after_heard

``ToolContext`` comes with livekit-agents (the ``livekit`` extra), so it is imported on first use:
the worker's call path imports this package without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from duplex_agent.agent.tools.call_control import CallControl, CallControlError
from duplex_agent.agent.tools.markers import after_heard

if TYPE_CHECKING:
    from duplex_agent.agent.tools.context import ToolContext

__all__ = ["CallControl", "CallControlError", "ToolContext", "after_heard"]


def __getattr__(name: str) -> Any:
    if name == "ToolContext":
        from duplex_agent.agent.tools.context import ToolContext

        return ToolContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
