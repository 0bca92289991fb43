"""A LiveKit Agents app on a duplex-agent model, with a tool.

On this machine, with the loopback LiveKit server and the page: ``make livekit-agents-dev``.
Against any LiveKit server (LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET), as livekit-agents
1.8.9 runs an app (its own ``dev`` subcommand is deprecated)::

    python -m livekit.agents start examples/livekit_agents_app.py --dev   # or: lk agent dev

With LIVEKIT_AGENT_NAME set, it registers under that name (explicit dispatch: a room token or
the dispatch API names it); without, it is dispatched to every new room. With DUPLEX_URL (a
duplex-agent or vLLM-Omni ``ws://.../v1/realtime?duplex=1``) the model runs there; without it,
the reference model runs in this process, shared by every job: with DUPLEX_OPENAI_BASE_URL (and
DUPLEX_OPENAI_MODEL) its replies come from that OpenAI-compatible chat endpoint, which can call
tools; else it says back what it heard, and calls none.

The tool is an ordinary livekit-agents ``@function_tool``: the model asks for it, the session
runs it here, and the model speaks its answer.
"""

import os

from livekit import agents
from livekit.agents import Agent, AgentServer, AgentSession, JobExecutorType, function_tool

from duplex_agent.livekit_agents import DuplexModel

url = os.environ.get("DUPLEX_URL")
chat_url = os.environ.get("DUPLEX_OPENAI_BASE_URL")
if url:
    model = DuplexModel(url)
elif chat_url:
    model = DuplexModel.in_process("reference", responder="openai", openai_base_url=chat_url,
                                   openai_model=os.environ.get("DUPLEX_OPENAI_MODEL", ""))
else:
    model = DuplexModel.in_process("reference")
# Job threads: in-process models need them. host: where livekit-agents' HTTP server (health, worker
# status) listens; livekit-agents' default is every interface (make livekit-agents-dev sets DUPLEX_HOST).
server = AgentServer(job_executor_type=JobExecutorType.THREAD, host=os.environ.get("DUPLEX_HOST", ""))


@function_tool
async def get_weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: The city's name, e.g. Paris.
    """
    return f"It is sunny and 21 degrees in {city}."  # a stand-in: ask a weather service here


@server.rtc_session()
async def entrypoint(ctx: agents.JobContext) -> None:
    # aec_warmup_duration=None: from the first word, the caller can talk over the agent
    session = AgentSession(llm=model, aec_warmup_duration=None)
    # a model that cannot call tools refuses them (ToolsUnsupportedError): the echo model gets none
    tools = [get_weather] if model.calls_tools is not False else []
    agent = Agent(instructions="You are a friendly voice assistant. For the weather, call get_weather.", tools=tools)
    await session.start(room=ctx.room, agent=agent)


if __name__ == "__main__":
    agents.cli.run_app(server)
