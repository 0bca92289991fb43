"""The worker the tool bench dispatches to: a LiveKit Agents app on our DuplexModel, two ways per job.

The job's metadata picks the way: ``tool`` (a scripted model that answers through a get_weather
``@function_tool`` of the Agent) or ``plain`` (the same model's voice answering outright). Each
tool run goes to the JSON lines file BENCH_RECORD with its own run time. Run by
``bench.livekit_agents_tools``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from livekit import agents
from livekit.agents import Agent, AgentServer, AgentSession, JobExecutorType, RunContext, function_tool

from bench.tool_plugins import TOOL_OUTPUT
from duplex_agent.livekit_agents import DuplexModel

AGENT_NAME = "duplex-tools-bench"
RECORD = os.environ["BENCH_RECORD"]
#: What the tool stands in for (a weather service's answer time); measured, then taken off the figure.
TOOL_S = 0.2
MODELS = {"tool": DuplexModel.in_process("bench.tool_plugins.ToolCallingScripted"),
          "plain": DuplexModel.in_process("bench.tool_plugins.PlainScripted")}
server = AgentServer(job_executor_type=JobExecutorType.THREAD, port=0, host="127.0.0.1", load_fnc=lambda: 0.0)


def _record(room: str, kind: str, **data) -> None:
    with open(RECORD, "a") as f:
        f.write(json.dumps({"room": room, "kind": kind, "at": time.time(), **data}) + "\n")


@function_tool
async def get_weather(context: RunContext, city: str) -> str:
    """Today's weather in a city.

    Args:
        city: The city's name.
    """
    started = time.perf_counter()
    await asyncio.sleep(TOOL_S)
    _record(context.session.room_io.room.name, "tool", run_ms=1000.0 * (time.perf_counter() - started))
    return TOOL_OUTPUT


@server.rtc_session(agent_name=AGENT_NAME)
async def entrypoint(ctx: agents.JobContext) -> None:
    mode = ctx.job.metadata
    session = AgentSession(llm=MODELS[mode], aec_warmup_duration=None)
    agent = Agent(instructions="Answer about the weather.", tools=[get_weather] if mode == "tool" else [])
    await session.start(room=ctx.room, agent=agent)
    duplex = session.current_agent.duplex_session
    while duplex.caller_audio_s == 0.0:  # the caller's audio reaches the model: it may ask now
        await asyncio.sleep(0.02)
    _record(ctx.room.name, "started")


if __name__ == "__main__":
    agents.cli.run_app(server)
