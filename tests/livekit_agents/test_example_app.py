"""examples/livekit_agents_app.py as a user runs it: ``dev`` against a LiveKit server (here the
loopback one), dispatched automatically when a caller joins, answering with the in-process
reference model."""

from __future__ import annotations

import sys

import pytest

from devtools.speech import words
from tests.livekit.caller import LiveKitCaller
from tests.livekit_agents.conftest import REPO, AgentProcess, _environment
from tests.support.waits import until


@pytest.mark.slow
async def test_the_example_app_answers_a_caller(livekit_server, tmp_path, processes):
    app = AgentProcess([], _environment(LIVEKIT_URL=livekit_server.url, LIVEKIT_API_KEY=livekit_server.api_key,
                                        LIVEKIT_API_SECRET=livekit_server.api_secret, PYTHONPATH=str(REPO)),
                       tmp_path / "example.log")
    app.args = [sys.executable, str(REPO / "examples" / "livekit_agents_app.py"), "dev"]
    processes.append(app)
    app.start()
    await livekit_server.wait_for_worker("", available=True, timeout=120)
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token("alice", "room-example"))
    await caller.join()
    try:
        await until(lambda: "listening" in caller.agent_states, 90, "the agent to join and listen")
        heard = await caller.say_and_hear("Please book a table for two people tonight.", timeout=120)
        assert {"said", "table"} <= set(words(heard)), heard
    finally:
        await caller.leave()
