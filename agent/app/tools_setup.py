"""Start-up with ``--tools``: the module loads before any model does, and a model that cannot call
tools stops the start, each with a one-line reason (the CLI's exit 2); ``start_serving_backend``
is that start, shared by ``serve`` and ``start``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.models.model_errors import MissingModelError, ModelStartError
from duplex_agent.plugins.contract import DuplexCapabilities

if TYPE_CHECKING:
    from duplex_agent.agent.session.ports import DuplexBackend
    from duplex_agent.agent.tools.toolbox import ToolBox

#: How a model that cannot call tools as it runs now can, when it has a way.
TOOL_HINTS = {
    "reference": "the reference model calls tools through an LLM that does: add --responder openai "
                 "--openai-base-url URL (an OpenAI-compatible endpoint)",
}


def load_edge_tools(settings: Settings) -> ToolBox | None:
    """The worker's tools, or None without ``--tools``; ToolModuleError (a ModelStartError) naming
    the module when it cannot serve, ValueError for a bad timeout or hold delay."""
    if not settings.tools:
        return None
    try:
        from duplex_agent.agent.tools.loading import load_tool_module
        from duplex_agent.agent.tools.toolbox import EdgeToolOptions, ToolBox
    except ImportError as exc:  # tools are livekit-agents' function tools
        raise MissingModelError("livekit-agents (for the function tools of --tools)", "'duplex-agent[livekit]'") \
            from exc
    options = EdgeToolOptions(timeout_s=settings.tool_timeout, hold_after_s=settings.hold_after)
    return ToolBox(load_tool_module(settings.tools), options)


def require_tool_calls(tools: ToolBox | None, capabilities: DuplexCapabilities) -> None:
    """ModelStartError when there are tools and the model cannot call them."""
    if tools is None or capabilities.supports_tools:
        return
    hint = TOOL_HINTS.get(capabilities.plugin_id)
    raise ModelStartError(f"--tools {tools.module.name!r}: the model {capabilities.plugin_id!r} cannot call tools"
                          + (f"; {hint}" if hint else ""))


async def start_serving_backend(settings: Settings) -> tuple[DuplexBackend, ToolBox | None]:
    """What ``serve`` and ``start`` share before they take calls: the edge tools (a module that
    cannot serve fails before the model loads), the backend started, its model able to call
    them, and the started heap frozen out of garbage collection."""
    from duplex_agent.agent.app.bootstrap import start_backend
    from duplex_agent.agent.app.collector import freeze_what_started

    tools = load_edge_tools(settings)
    backend = await start_backend(settings)
    try:
        require_tool_calls(tools, backend.capabilities)
    except ModelStartError:
        await backend.close()
        raise
    freeze_what_started()
    return backend, tools
