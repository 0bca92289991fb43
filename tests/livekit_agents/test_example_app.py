"""examples/livekit_agents_app.py as a new user runs it: ``make livekit-agents-dev``
(``devtools.livekit_dev --app``): the loopback LiveKit server, the page, and the example run as
livekit-agents runs an app in development (``python -m livekit.agents start APP --dev``),
registered under the agent name the page's dev tokens dispatch; a caller with such a token is
answered by the in-process reference model."""

from __future__ import annotations

import sys

import aiohttp
import pytest

from tests.livekit.caller import LiveKitCaller
from tests.serve_process import REPO, AgentProcess, environment
from tests.support.heard import reply_heard
from tests.support.ports import free_port
from tests.support.waits import until


@pytest.mark.slow
async def test_make_livekit_agents_dev_dispatches_the_example_to_the_pages_caller(tmp_path, processes):
    livekit_port, page_port = free_port(), free_port()
    dev = AgentProcess([], environment(), tmp_path / "livekit-agents-dev.log")
    dev.args = [sys.executable, "-m", "devtools.livekit_dev", "--livekit-port", str(livekit_port),
                "--app", str(REPO / "examples" / "livekit_agents_app.py"), "--host", "127.0.0.1", "--port", str(page_port)]
    processes.append(dev)
    dev.start()
    await until(lambda: "registered worker" in dev.log(), 120, "the example to register")
    assert '"agent_name": "duplex-agent"' in dev.log()

    page = f"http://127.0.0.1:{page_port}"
    async with aiohttp.ClientSession() as http:  # what the page asks for, in its LiveKit mode
        assert (await (await http.get(f"{page}/api/access")).json()) == {"key_required": False}
        config = await (await http.get(f"{page}/api/livekit/config")).json()
        assert config["enabled"] and config["agent_name"] == "duplex-agent", config
        answer = await (await http.post(f"{page}/api/livekit/token",
                                        json={"room": "room-example", "identity": "caller-alice"})).json()
    caller = LiveKitCaller(answer["url"], answer["token"])
    await caller.join()
    try:
        await until(lambda: "listening" in caller.agent_states, 90, "the agent to join and listen")
        question = "Please book a table for two people tonight."
        heard = await caller.say_and_hear(question, timeout=120)
        assert reply_heard(heard, "You said: " + question), heard
    finally:
        await caller.leave()
    # The example's SDK found the v1 signal path it asks for first (no 404, no fallback to /rtc).
    assert "signal connection failed" not in dev.log()
