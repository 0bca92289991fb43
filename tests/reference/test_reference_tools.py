"""The reference model calls a tool: real speech in, a function call out, the output back, and a
spoken answer that carries it. The chat endpoint is the tool-calling stand-in (tests.support.chat_stub)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from devtools.speech import speak, transcribe, words
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferenceOptions, ReferencePlugin
from tests.runtime.drivers import RunnerDriver
from tests.support.chat_stub import start_server, tool_calling_reply

RATE = 16000
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def reference_with_tools():
    seen: list[dict] = []
    chat, base_url = await start_server(tool_calling_reply(seen))
    plugin = ReferencePlugin(as_float32_audio)
    plugin.configure(ReferenceOptions(responder="openai", openai_base_url=base_url, openai_model="stub"),
                     max_sessions=1)
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1)
    driver = await RunnerDriver.open(backend)
    yield driver, plugin, seen
    await driver.close()
    await backend.close()
    await chat.cleanup()


async def until_spoken_done(driver, timeout: float) -> list[dict]:
    seen: list[dict] = []
    while True:
        seen.append(await driver.recv(timeout))
        if seen[-1]["type"] == "response.done" and seen[-1].get("function_call") is None:
            return seen


async def test_a_spoken_question_calls_the_tool_and_the_answer_speaks_its_output(reference_with_tools):
    driver, plugin, requests = reference_with_tools
    assert driver.runner.capabilities.supports_tools and not driver.runner.capabilities.replies_to_tool_output
    await driver.send({"type": "session.update", "session": {"input_sample_rate": RATE, "tools": [WEATHER]}})
    await driver.until("session.created")
    await driver.append(speak("What is the weather in Paris?", before_ms=300, after_ms=1200))

    turn = await until_spoken_done(driver, timeout=60)
    (call,) = [e for e in turn if e["type"] == "response.function_call_arguments.done"]
    assert "city" in json.loads(call["arguments"])
    assert turn[-1]["status"] == "completed"
    assert not [e for e in turn if e["type"] == "response.output_audio.delta"]  # the reply was the call alone
    assert requests[0]["tools"][0]["function"]["name"] == "get_weather"
    assert "weather" in requests[0]["messages"][-1]["content"].lower()

    await driver.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": "sunny and twenty one degrees"}})
    await driver.send({"type": "response.create"})
    answer = await until_spoken_done(driver, timeout=60)
    assert answer[-1]["status"] == "completed"
    said = " ".join(m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"])
    assert "sunny and twenty one degrees" in said
    deltas = [e for e in answer if e["type"] == "response.output_audio.delta"]
    audio = np.frombuffer(b"".join(base64.b64decode(d["delta"]) for d in deltas), "<i2").astype(np.float32) / 32768
    assert "sunny" in words(transcribe(audio, deltas[0]["sample_rate"]))
    # The endpoint was asked again with the call and its output, and no new question.
    continued = requests[-1]["messages"]
    assert continued[-2]["tool_calls"][0]["id"] == call["call_id"]
    assert continued[-1] == {"role": "tool", "tool_call_id": call["call_id"],
                             "content": "sunny and twenty one degrees"}
    history = plugin.context(driver.runner.session_id).history
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
