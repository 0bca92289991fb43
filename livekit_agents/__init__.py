"""duplex-agent's models in LiveKit Agents apps: ``AgentSession(llm=DuplexModel(...))``.

A ``DuplexModel`` runs either on a duplex realtime websocket (a duplex-agent or a
vLLM-Omni server) or in the worker's own process, and brings this project's edge
barge-in and heard-only history to the ``AgentSession``: the caller's speech over
the agent clears the playout at once and interrupts the session, and both the
model's history and the session's chat context keep only what the caller heard.
"""

try:
    import livekit.agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("duplex_agent.livekit_agents needs the livekit extra: "
                      "pip install 'duplex-agent[livekit]'") from exc

from duplex_agent.livekit_agents import call_control  # noqa: E402,F401 (the call-control tools act through it)
from duplex_agent.livekit_agents.model import DuplexModel  # noqa: E402
from duplex_agent.livekit_agents.session import DuplexAgentSession, ToolsUnsupportedError  # noqa: E402

# Importing the router registers its exit hook: livekit's own exit can abort an app's process
# (exit code 134) when one of its threads is still in a callback into Python; the hook waits
# for those, as in the worker. The app's rtc objects stay the SDK's; nothing is routed.
from duplex_agent.webrtc.livekit import ffi_router  # noqa: E402,F401

__all__ = ["DuplexAgentSession", "DuplexModel", "ToolsUnsupportedError"]
