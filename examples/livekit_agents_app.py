"""A LiveKit Agents app on a duplex-agent model.

On this machine, with the loopback LiveKit server and the page: ``make livekit-agents-dev``.
Against any LiveKit server (LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET), as livekit-agents
1.8.9 runs an app (its own ``dev`` subcommand is deprecated)::

    python -m livekit.agents start examples/livekit_agents_app.py --dev   # or: lk agent dev

With LIVEKIT_AGENT_NAME set, it registers under that name (explicit dispatch: a room token or
the dispatch API names it); without, it is dispatched to every new room. With DUPLEX_URL (a
duplex-agent or vLLM-Omni ``ws://.../v1/realtime?duplex=1``) the model runs there; without it,
the reference model runs in this process, shared by every job.
"""

import os

from livekit import agents
from livekit.agents import Agent, AgentServer, AgentSession, JobExecutorType

from duplex_agent.livekit_agents import DuplexModel

url = os.environ.get("DUPLEX_URL")
model = DuplexModel(url) if url else DuplexModel.in_process("reference")
# Job threads: in-process models need them. host: where livekit-agents' HTTP server (health, worker
# status) listens; livekit-agents' default is every interface (make livekit-agents-dev sets DUPLEX_HOST).
server = AgentServer(job_executor_type=JobExecutorType.THREAD, host=os.environ.get("DUPLEX_HOST", ""))


@server.rtc_session()
async def entrypoint(ctx: agents.JobContext) -> None:
    # aec_warmup_duration=None: from the first word, the caller can talk over the agent
    session = AgentSession(llm=model, aec_warmup_duration=None)
    await session.start(room=ctx.room, agent=Agent(instructions="You are a friendly voice assistant."))


if __name__ == "__main__":
    agents.cli.run_app(server)
