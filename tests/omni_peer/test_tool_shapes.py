"""The tool cases, sent to the real vLLM-Omni 0.30.0 server and to ours; the answers must agree key by key.

vLLM-Omni's side is the peer with ``--tools`` (its scripted model calls the session's tool through
vLLM-Omni's own ``function_call.done`` path); ours is our endpoint with the scripted model making
the same call. The single-command cases go through ``wire_shapes.run_case``; a call, its output and
the refused outputs need the call's id, so they run in one session each (``run_call``), and what is
compared is the call's own response and the answer to what was sent after it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.omni_peer.test_command_shapes import APPEND
from tests.omni_peer.wire_shapes import (
    ANSWER_TIMEOUT_S,
    FENCE,
    FENCE_ANSWER,
    Answer,
    Case,
    Intended,
    diff,
    run_case,
    unexcused,
)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "examples": ["Paris"]}},
                          "required": ["city"]}}
WITH_TOOLS = {"turn_detection": None, "tools": [WEATHER], "tool_choice": "auto"}
COMMIT = {"type": "input_audio_buffer.commit", "response_create": True}

CASES = [
    Case("session.update with tools", [{"type": "session.update", "session": WITH_TOOLS}]),
    Case("session.update clears tools", [{"type": "session.update", "session": {"tools": None,
                                                                                "tool_choice": None}}],
         session=WITH_TOOLS),
    Case("session.update tools not a list", [{"type": "session.update", "session": {"tools": "get_weather"}}]),
    Case("session.update schema not an object",
         [{"type": "session.update", "session": {"tools": [{**WEATHER, "parameters": {"type": "string"}}]}}]),
    Case("response.create with tools", [APPEND, {"type": "input_audio_buffer.commit", "response_create": False},
                                        {"type": "response.create", "response": {"tools": [WEATHER],
                                                                                 "tool_choice": "none"}}],
         session=WITH_TOOLS),
    Case("function_call_output for no call", [{"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_nobody", "output": "x"}}], session=WITH_TOOLS),
]

#: The call's own response, then what follows each step sent after it (``CALL`` stands for its call_id).
CALL = "CALL"
AFTER_THE_CALL = {
    "an output": [{"type": "conversation.item.create",
                   "item": {"type": "function_call_output", "call_id": CALL, "output": "sunny"}}],
    "an output that is not a string": [{"type": "conversation.item.create",
                                        "item": {"type": "function_call_output", "call_id": CALL, "output": 21}}],
    "a second output": [{"type": "conversation.item.create",
                         "item": {"type": "function_call_output", "call_id": CALL, "output": "sunny"}},
                        {"type": "conversation.item.create",
                         "item": {"type": "function_call_output", "call_id": CALL, "output": "again"}}],
}

INTENDED = [
    *(Intended(case, ("events: vLLM-Omni ['session.updated']", "        ours      ['error']",
                      "error codes: vLLM-Omni [], ours ['invalid_tools']"),
               "malformed tools are refused here; vLLM-Omni passes them to the model unchecked")
      for case in ("session.update tools not a list", "session.update schema not an object")),
]
#: Differences seen and not (yet) decided on: each fails here until our server matches or docs/protocol.md
#: lists it as intended (then it moves to ``INTENDED``).
UNDECIDED = {
    "session.update clears tools": "vLLM-Omni's session.updated shows the cleared tools and tool_choice as null; "
                                   "ours leaves them out",
    "response.create with tools": "vLLM-Omni 0.30.0 refuses tools/tool_choice in response.create for every native "
                                  "duplex session (unsupported_native_response_options); ours applies them",
}


def _script() -> Script:
    return Script(reply="checking", calls=[{"name": "get_weather", "arguments": '{"city":"Paris"}'}],
                  calls_after_words=0, tool_reply="it is {output}")


@pytest.fixture(scope="module")
def peer(omni_peers):
    return omni_peers(tools=True)


@pytest.fixture
async def ours():
    plugin = ScriptedPlugin(as_float32_audio, _script())
    local = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=16)
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)
    await server.close()
    await local.close()


def _compare(name: str, real: Answer, mine: Answer) -> None:
    assert not real.note, f"the real vLLM-Omni server did not answer {name}: {real.note} {real.names}"
    differences, extras = diff(real, mine)
    if extras:
        print(f"{name}: our extras (a vLLM-Omni client ignores them):\n" + "\n".join(extras))
    remaining, stale = unexcused(name, differences, INTENDED)
    for entry in stale:
        print(f"{name}: the intended difference ({entry.reason}) did not occur this run")
    assert not remaining, f"{name}: ours differs from vLLM-Omni 0.30.0\n" + "\n".join(remaining)


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.xfail(reason=UNDECIDED[case.name], strict=True))
                                  if case.name in UNDECIDED else case for case in CASES],
                         ids=[case.name for case in CASES])
async def test_tool_command_answer_matches_vllm_omni(peer, ours, case):
    real, mine = await asyncio.gather(run_case(peer.realtime_url, case), run_case(ours, case))
    _compare(case.name, real, mine)


async def run_call(url: str, after: list[dict[str, Any]]) -> tuple[Answer, Answer]:
    """(the call's own response, the answer to ``after``) in a fresh session with tools."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=64 << 20) as ws:
        received: list[dict[str, Any]] = []

        async def until(done) -> bool:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ANSWER_TIMEOUT_S
            while loop.time() < deadline:
                message = await ws.receive(timeout=max(0.01, deadline - loop.time()))
                if message.type != aiohttp.WSMsgType.TEXT:
                    return False
                received.append(json.loads(message.data))
                if done(received[-1]):
                    return True
            return False

        def is_call_done(event: dict[str, Any]) -> bool:
            output = (event.get("response") or {}).get("output") or [{}]
            return event["type"] == "response.done" and output[0].get("type") == "function_call"

        await ws.send_str(json.dumps({"type": "session.update", "session": WITH_TOOLS}))
        await ws.send_str(json.dumps(FENCE))
        assert await until(lambda e: e["type"] == FENCE_ANSWER), "no answer to the opening"
        opening = len(received)
        for event in (APPEND, COMMIT):
            await ws.send_str(json.dumps(event))
        if not await until(is_call_done):
            return Answer(received[opening:], "no call"), Answer([])
        done = received[-1]
        call_id, response_id = done["response"]["output"][0]["call_id"], done["response_id"]
        item_id = done["response"]["output"][0]["id"]
        call = [e for e in received[opening:] if e.get("response_id") == response_id
                or (e["type"].startswith("conversation.item.") and (e.get("item") or {}).get("id") == item_id)]
        # The spoken reply the call came in ends, and is heard whole.
        spoken = next(e["response_id"] for e in received[opening:] if e["type"] == "response.created"
                      and e["response_id"] != response_id)
        if not any(e["type"] == "response.done" and e["response_id"] == spoken for e in received):
            assert await until(lambda e: e["type"] == "response.done" and e["response_id"] == spoken), "no reply end"
        await ws.send_str(json.dumps({"type": "playback.ack", "response_id": spoken, "played_ms": 60000}))
        await ws.send_str(json.dumps(FENCE))
        assert await until(lambda e: e["type"] == FENCE_ANSWER), "no answer to the ack"
        start = len(received)
        for event in after:
            await ws.send_str(json.dumps(json.loads(json.dumps(event).replace(f'"{CALL}"', json.dumps(call_id)))))
        await ws.send_str(json.dumps(FENCE))
        answered = await until(lambda e: e["type"] == FENCE_ANSWER)
        await ws.send_str(json.dumps({"type": "session.close"}))
        return Answer(call), Answer(received[start:-1] if answered else received[start:],
                                    "" if answered else "no fence answer")


async def test_a_call_is_announced_as_vllm_omni_announces_it(peer, ours):
    (real, _), (mine, _) = await asyncio.gather(run_call(peer.realtime_url, []), run_call(ours, []))
    assert real.names == ["response.created", "conversation.item.added", "conversation.item.created",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done",
                          "conversation.item.done", "response.done"], real.names
    _compare("a call", real, mine)


@pytest.mark.parametrize("name", list(AFTER_THE_CALL))
async def test_after_a_call_the_answer_matches_vllm_omni(peer, ours, name):
    (_, real), (_, mine) = await asyncio.gather(run_call(peer.realtime_url, AFTER_THE_CALL[name]),
                                                run_call(ours, AFTER_THE_CALL[name]))
    _compare(name, real, mine)
