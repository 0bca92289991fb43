"""Tiny livekit-agents worker used by the loopback server tests (run as a subprocess).

env: LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET, TEST_AGENT_NAME,
     TEST_AGENT_FULL=1 to make the worker report itself full (load 1.0 >= threshold 0.5).
"""

from __future__ import annotations

import asyncio
import logging
import os

from livekit.agents import AgentServer, JobContext, JobExecutorType

FULL = os.environ.get("TEST_AGENT_FULL") == "1"

server = AgentServer(
    job_executor_type=JobExecutorType.THREAD,
    num_idle_processes=0,
    port=0,
    load_threshold=0.5 if FULL else float("inf"),
    load_fnc=(lambda: 1.0) if FULL else (lambda: 0.0),
    max_retry=3,
)


async def entrypoint(ctx: JobContext) -> None:
    await ctx.connect()
    lp = ctx.room.local_participant
    await lp.set_attributes({"test.agent": "ready", "test.job_metadata": ctx.job.metadata})
    await lp.send_text("hello from agent", topic="test.agent")
    # returning keeps the job connected until the room closes or the job is terminated


server.rtc_session(entrypoint, agent_name=os.environ.get("TEST_AGENT_NAME", "test-agent"))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("TEST_AGENT_LOG", "INFO"))
    asyncio.run(server.run(devmode=True))
