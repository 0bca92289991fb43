"""duplex-agent's models in LiveKit Agents apps: ``AgentSession(llm=DuplexModel(...))``.

A ``DuplexModel`` runs either on a duplex realtime websocket (a duplex-agent or a
vLLM-Omni server) or in the worker's own process, and brings this project's edge
barge-in and heard-only history to the ``AgentSession``: the caller's speech over
the agent clears the playout at once and interrupts the session, and both the
model's history and the session's chat context keep only what the caller heard.
"""

from duplex_agent.livekit_agents.model import DuplexModel
from duplex_agent.livekit_agents.session import DuplexAgentSession

__all__ = ["DuplexAgentSession", "DuplexModel"]
