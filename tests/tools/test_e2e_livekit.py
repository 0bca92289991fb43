"""A LiveKit caller asks the weather: the real worker process (`duplex-agent start --tools`) on the
loopback LiveKit server, the reference model with `--responder openai` against a tool-calling chat
endpoint (tests.support.chat_stub) that this test serves."""

from __future__ import annotations

from devtools.speech import words
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import AGENT_NAME, livekit_server, processes, ready_worker, start_worker  # noqa: F401
from tests.support.chat_stub import start_server, tool_calling_reply
from tests.support.heard import reply_heard
from tests.support.waits import until


async def test_a_livekit_caller_asks_the_weather_and_hears_the_tools_answer(livekit_server, ready_worker):  # noqa: F811
    seen: list[dict] = []
    chat, base_url = await start_server(tool_calling_reply(seen))
    caller = None
    try:
        await ready_worker(max_sessions=1, extra=("--tools", "tests.tools.weather_tools", "--responder", "openai",
                                                  "--openai-base-url", base_url, "--openai-model", "stub"))
        caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token("alice", "weather-call"))
        await caller.join()
        await livekit_server.create_dispatch("weather-call", AGENT_NAME)
        await until(lambda: "listening" in caller.agent_states, 40, "the agent")
        # The reply as the caller got it: its transcript, and its audio to the last frame on its way.
        reply = await caller.say_and_listen("What's the weather in Paris?", timeout=90)
        assert "sunny and 21 degrees in paris" in reply.transcript.lower()
        # The endpoint got the tool's output from the worker's edge, and answered with it.
        tool_messages = [m for m in seen[-1]["messages"] if m.get("role") == "tool"]
        assert tool_messages and tool_messages[-1]["content"] == "It is sunny and 21 degrees in Paris."
        # (Whisper on the agent's voice writes "sunny" as "Sonny" now and then: most of the answer's words)
        assert reply_heard(reply.heard, reply.transcript) and "degrees" in words(reply.heard), reply
    finally:
        if caller is not None:
            await caller.leave()
        await chat.cleanup()
