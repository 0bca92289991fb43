"""The OpenAI-compatible responder with tools: what it sends, and the calls it reads from a stream."""

from __future__ import annotations

import json
from itertools import zip_longest

from aiohttp import web

from duplex_agent.plugins.reference.responders import NO_OUTPUT_YET, EchoResponder, OpenAIResponder, ToolCall
from tests.support.chat_stub import chunk, start_server, stream_reply, tool_call_chunks, tool_calling_reply

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
TIME = {"type": "function", "name": "get_time", "description": "",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}


async def collect(stream) -> list:
    return [piece async for piece in stream]


def streaming(chunks: list[dict], seen: list[dict]):
    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        return await stream_reply(request, chunks)

    return handler


async def test_several_tool_calls_in_one_streamed_reply_arguments_in_pieces():
    paris, cet = json.dumps({"city": "Paris"}), json.dumps({"zone": "CET"})
    first = tool_call_chunks(0, "call_a", "get_weather", paris, piece=3)
    second = tool_call_chunks(1, "call_b", "get_time", cet, piece=2)
    # The two calls' pieces interleaved: each piece goes by its index.
    interleaved = [c for pair in zip_longest(first, second) for c in pair if c is not None]
    chunks = [chunk("Let me"), chunk(" check."), *interleaved,
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    seen: list[dict] = []
    runner, base_url = await start_server(streaming(chunks, seen))
    try:
        pieces = await collect(OpenAIResponder(base_url, "m").respond(
            [], "weather and time?", tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_weather"}))
    finally:
        await runner.cleanup()
    assert pieces == ["Let me", " check.", ToolCall("call_a", "get_weather", paris), ToolCall("call_b", "get_time", cet)]
    body = seen[0]
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather",
                                                               "description": "The weather in a city",
                                                               "parameters": WEATHER["parameters"]}},
                             {"type": "function", "function": {"name": "get_time", "description": "",
                                                               "parameters": TIME["parameters"]}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


async def test_no_tools_sends_none_and_a_call_without_arguments_takes_none():
    seen: list[dict] = []
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_x",
                                                                 "function": {"name": "ping"}}]}}]}]
    runner, base_url = await start_server(streaming(chunks, seen))
    try:
        pieces = await collect(OpenAIResponder(base_url, "m").respond([], "hi"))
    finally:
        await runner.cleanup()
    assert "tools" not in seen[0] and "tool_choice" not in seen[0]
    assert pieces == [ToolCall("call_x", "ping", "{}")]


async def test_history_pairs_each_call_with_its_output():
    history = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_p", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ]},
        {"role": "user", "content": "and hurry"},  # the caller spoke before the outputs came back
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_gone", "content": "a call no longer in view"},
    ]
    seen: list[dict] = []
    runner, base_url = await start_server(streaming([chunk("ok")], seen))
    try:
        await collect(OpenAIResponder(base_url, "m").respond(history, None, tools=[WEATHER]))
    finally:
        await runner.cleanup()
    assert seen[0]["messages"] == [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": history[1]["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_r", "content": NO_OUTPUT_YET},
        {"role": "user", "content": "and hurry"},
    ]  # no new user message: it answers from the history


async def test_the_stub_calls_by_its_rules_and_answers_with_the_output():
    seen: list[dict] = []
    runner, base_url = await start_server(tool_calling_reply(seen))
    responder = OpenAIResponder(base_url, "m")
    try:
        calls = await collect(responder.respond([], "What is the weather in Paris and Rome?", tools=[WEATHER]))
        history = [{"role": "user", "content": "What is the weather in Paris and Rome?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                       for c in calls]},
                   *[{"role": "tool", "tool_call_id": c.call_id, "content": f"sunny in {c.arguments}"}
                     for c in calls]]
        answer = await collect(responder.respond(history, None, tools=[WEATHER]))
        refused = await collect(responder.respond([], "the weather in Oslo?", tools=[WEATHER], tool_choice="none"))
        forced = await collect(responder.respond([], "hello", tools=[WEATHER, TIME],
                                                 tool_choice={"type": "function", "name": "get_time"}))
    finally:
        await runner.cleanup()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                   ("get_weather", {"city": "Rome"})]
    assert "".join(answer) == 'The tool says: sunny in {"city": "Paris"}; sunny in {"city": "Rome"}.'
    assert all(isinstance(p, str) for p in refused) and "Oslo" in "".join(refused)
    assert [c.name for c in forced] == ["get_time"]


async def test_echo_has_nothing_to_say_without_new_words():
    assert await collect(EchoResponder().respond([], None, tools=[WEATHER])) == []
