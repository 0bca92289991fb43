"""Our endpoint where vLLM-Omni 0.30.0's real server was seen to answer differently (issue 21).

Each expectation is what 0.30.0's own code sends: ``protocol.duplex.events`` (the wire
rendering), ``engine.duplex.realtime_events`` (the projection), ``entrypoints.duplex``
(the handshake and disconnect).
"""

from __future__ import annotations

import pytest

from duplex_agent.plugins.scripted import Script
from tests.support.audio import tone

MANUAL = {"turn_detection": None}


async def ask(omni) -> None:
    await omni.append(tone(200))
    await omni.send({"type": "input_audio_buffer.commit"})


@pytest.mark.parametrize("cancel", [
    {"type": "response.cancel", "event_id": "evt_late"},
    {"type": "turn.signal", "event": "response.cancel", "event_id": "evt_late"},
])
async def test_a_cancel_after_the_latest_reply_finished_is_response_not_active(our_server, cancel):
    _, client, _, _ = await our_server(Script(reply="done already"))
    omni = client()
    await omni.open(MANUAL)
    await ask(omni)
    done, _ = await omni.until("response.done")
    await omni.append(tone(3000))  # 150 appends keep the session's mailbox busy when the cancel arrives
    await omni.send({"type": "input_audio_buffer.clear"})
    await omni.send(cancel)
    error, seen = await omni.until("error")
    assert error["error"]["code"] == "response_not_active" and error["error"]["event_id"] == "evt_late"
    assert done["response_id"] in error["error"]["message"]
    kinds = [e["type"] for e in seen]
    assert "output_audio_buffer.cleared" not in kinds
    assert "input_audio_buffer.cleared" in kinds, f"answered ahead of the clear sent before it: {kinds}"
    # A cancel while a reply runs still cancels it.
    await ask(omni)
    await omni.until("response.created")
    await omni.send({"type": "response.cancel"})
    cancelled, _ = await omni.until("response.done")
    assert cancelled["response"]["status"] in ("cancelled", "completed")


async def test_a_model_in_the_query_opens_the_session_before_any_client_message(our_server):
    url, client, _, _ = await our_server()
    omni = client()
    await omni.connect("&model=scripted")
    created = await omni.recv()
    assert created["type"] == "session.created" and created["resume_token"]
    echo = await omni.recv()
    assert echo["type"] == "session.updated"
    # A session.update then updates that session; it opens no other.
    await omni.send({"type": "session.update", "session": {"instructions": "later", **MANUAL}})
    updated, _ = await omni.until("session.updated")
    assert updated["session"]["id"] == created["session"]["id"] and updated["session"]["instructions"] == "later"


async def test_autostart_0_waits_for_the_first_message(our_server):
    _, client, _, _ = await our_server()
    omni = client()
    await omni.connect("&model=scripted&autostart=0")
    await omni.send({"type": "session.update", "session": {"instructions": "mine", **MANUAL}})
    created = await omni.recv()
    assert created["type"] == "session.created" and created["session"]["instructions"] == "mine"


async def test_turn_events_carry_vllm_omnis_fields(our_server):
    _, client, _, _ = await our_server(Script(reply="one two three four five six", word_delay_s=0.05))
    omni = client()
    created = await omni.open(MANUAL)
    session = created["session"]
    assert session["state"] == "open" and session["turn_state"] == "idle"
    assert isinstance(session["epoch"], int) and isinstance(session["turn_id"], int)
    await ask(omni)
    done, seen = await omni.until("response.done")
    by_type = {e["type"]: e for e in seen}
    committed = by_type["input_audio_buffer.committed"]
    assert committed["event"]["type"] == "input.committed"
    assert committed["event"]["realtime_item_id"] == committed["item_id"]
    assert committed["event"]["session_id"] == session["id"]
    transcribed = by_type["conversation.item.input_audio_transcription.completed"]
    assert transcribed["content_index"] == 0 and transcribed["item_id"] == committed["item_id"]
    speak = by_type["response.speak"]
    assert speak["item_id"] == by_type["response.created"]["item_id"]
    assert speak["metadata"]["session_id"] == session["id"] and speak["metadata"]["model_speak"] is True
    assert done["response"]["status_details"] == {"type": "completed", "reason": "stop"}
    # A cancelled reply says why.
    await ask(omni)
    await omni.until("response.output_audio.delta")
    await omni.send({"type": "response.cancel"})
    cancelled, _ = await omni.until("response.done")
    assert cancelled["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    # The session object follows the turn and the fence.
    await omni.send({"type": "session.update", "session": {"instructions": "again"}})
    updated, _ = await omni.until("session.updated")
    assert updated["session"]["turn_state"] == "idle" and updated["session"]["epoch"] > session["epoch"]


async def test_an_unknown_playback_commit_policy_is_taken_as_the_default(our_server):
    _, client, _, _ = await our_server()
    omni = await client().connect()
    await omni.send({"type": "session.update", "session": {"playback_commit_policy": "ack", **MANUAL}})
    created, seen = await omni.until("session.created")
    assert not [e for e in seen if e["type"] == "error"] and created["session"]["state"] == "open"


# ---- tools (vLLM-Omni 0.30.0: ``engine_session.as_public_dict``, ``realtime_events._function_call_done_events``,
# ``resolve_create_item``, ``normalize_conversation_item``, ``config`` for response.create's tools) ----

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOLS = {**MANUAL, "tools": [WEATHER], "tool_choice": "auto"}
CALL = Script(reply="", calls=[{"name": "get_weather", "arguments": '{"city": "Paris"}', "call_id": "call_paris"}],
              tool_reply="it is {output}")


def omni_fields(event: dict, *names: str) -> dict:
    """The fields vLLM-Omni's own rendering of ``event`` has (ours may add more beside them)."""
    return {name: event[name] for name in ("type", *names)}


async def called(omni) -> list[dict]:
    """Ask, and read to the end of the reply (the spoken response the call comes inside of): the
    events of the call's own response."""
    await ask(omni)
    read: list[dict] = []
    while True:
        done, seen = await omni.until("response.done")
        read += seen
        if not (done["response"]["output"] and done["response"]["output"][0].get("type") == "function_call"):
            break
    call = next(e["response_id"] for e in read if e["type"] == "response.done"
                and e["response"]["output"][0].get("type") == "function_call")
    start = next(i for i, e in enumerate(read) if e["type"] == "response.created" and e["response_id"] == call)
    end = next(i for i, e in enumerate(read) if e["type"] == "response.done" and e["response_id"] == call)
    return read[start:end + 1]


async def test_tools_in_session_update_are_shown_in_the_session(our_server):
    _, client, _, _ = await our_server(CALL)
    created = await client().open(TOOLS)
    assert created["session"]["tools"] == [WEATHER] and created["session"]["tool_choice"] == "auto"
    assert created["session"]["capabilities"]["supports_tools"] is True


async def test_a_function_call_is_announced_as_vllm_omni_announces_it(our_server):
    _, client, _, _ = await our_server(CALL)
    omni = client()
    await omni.open(TOOLS)
    events = await called(omni)
    response_id = events[0]["response_id"]
    item = events[1]["item"]
    assert item == {"id": item["id"], "object": "realtime.item", "type": "function_call", "status": "completed",
                    "name": "get_weather", "call_id": "call_paris", "arguments": '{"city": "Paris"}'}
    item_id = item["id"]
    response = {"id": response_id, "object": "realtime.response", "status_details": {"type": "completed",
                                                                                      "reason": "completed"},
                "metadata": {}}
    previous = events[1]["previous_item_id"]
    assert [omni_fields(e, *fields) for e, fields in zip(events, [
        ("response_id", "response"), ("previous_item_id", "item"), ("previous_item_id", "item"),
        ("response_id", "output_index", "item"), ("response_id", "item_id", "output_index", "call_id", "delta"),
        ("response_id", "item_id", "output_index", "call_id", "arguments"), ("response_id", "output_index", "item"),
        ("previous_item_id", "item"), ("response_id", "response")], strict=True)] == [
        {"type": "response.created", "response_id": response_id,
         "response": {**response, "status": "in_progress", "output": []}},
        {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
        {"type": "conversation.item.created", "previous_item_id": previous, "item": item},
        {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item},
        {"type": "response.function_call_arguments.delta", "response_id": response_id, "item_id": item_id,
         "output_index": 0, "call_id": "call_paris", "delta": '{"city": "Paris"}'},
        {"type": "response.function_call_arguments.done", "response_id": response_id, "item_id": item_id,
         "output_index": 0, "call_id": "call_paris", "arguments": '{"city": "Paris"}'},
        {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item},
        {"type": "conversation.item.done", "previous_item_id": previous, "item": item},
        {"type": "response.done", "response_id": response_id,
         "response": {**response, "status": "completed", "output": [item]}},
    ]


async def test_a_call_inside_a_reply_leaves_that_reply_the_active_one(our_server):
    script = Script(reply="let me check", calls=[{"name": "get_weather", "call_id": "call_mid"}],
                    calls_after_words=1, hold_after_words=1)
    _, client, _, _ = await our_server(script)
    omni = client()
    await omni.open(TOOLS)
    await ask(omni)
    spoken, _ = await omni.until("response.created")
    call_done, _ = await omni.until("response.done")
    assert call_done["response"]["output"][0]["call_id"] == "call_mid"
    await omni.send({"type": "session.update", "session": {"instructions": "meanwhile"}})
    updated, _ = await omni.until("session.updated")
    assert updated["session"]["active_response_id"] == spoken["response_id"]
    assert updated["session"]["turn_state"] == "assistant_generating"
    script.released.set()
    done, _ = await omni.until("response.done")
    assert done["response_id"] == spoken["response_id"] and done["response"]["status"] == "completed"
    # A cancel now is of a finished reply, as for any reply (the call's response never was the active one).
    await omni.send({"type": "response.cancel", "event_id": "evt_late"})
    error, _ = await omni.until("error")
    assert error["error"]["code"] == "response_not_active" and spoken["response_id"] in error["error"]["message"]


async def test_an_output_is_announced_and_response_create_with_tools_answers_it(our_server):
    _, client, plugin, _ = await our_server(CALL)
    omni = client()
    await omni.open(TOOLS)
    call = (await called(omni))[-1]["response"]["output"][0]
    await omni.send({"type": "conversation.item.create",
                     "item": {"type": "function_call_output", "call_id": "call_paris", "output": "sunny"}})
    done, seen = await omni.until("conversation.item.done")
    item = done["item"]
    assert item == {"id": item["id"], "type": "function_call_output", "call_id": "call_paris", "output": "sunny",
                    "object": "realtime.item", "status": "completed", "content": []}
    assert [omni_fields(e, "previous_item_id", "item") for e in seen] == [
        {"type": kind, "previous_item_id": call["id"], "item": item}
        for kind in ("conversation.item.added", "conversation.item.created", "conversation.item.done")]
    await omni.send({"type": "response.create", "response": {"tools": [WEATHER], "tool_choice": "none"}})
    created, _ = await omni.until("response.created")
    answer, seen = await omni.until("response.done")
    assert answer["response_id"] == created["response_id"] and answer["response"]["status"] == "completed"
    assert "".join(e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta").split() == \
        ["it", "is", "sunny"]
    assert plugin.script.continuation_options[-1]["realtime_response_tool_choice"] == "none"


@pytest.mark.parametrize(("item", "param", "message"), [
    ({"call_id": "call_nobody", "output": "x"}, "item.call_id",
     "function_call_output requires the call_id of a completed function call"),
    ({"output": "x"}, "item.call_id", "function_call_output requires the call_id of a completed function call"),
    ({"call_id": "call_paris", "output": 21}, "item.output", "function_call_output requires a string output"),
    ({"call_id": "call_paris", "output": "again"}, "item.output",
     "function_call_output already exists for call_id call_paris"),
])
async def test_each_refused_output_is_vllm_omnis_error(our_server, item, param, message):
    _, client, _, _ = await our_server(CALL)
    omni = client()
    await omni.open(TOOLS)
    await called(omni)
    if item.get("output") == "again":
        await omni.send({"type": "conversation.item.create",
                         "item": {"type": "function_call_output", "call_id": "call_paris", "output": "first"}})
        await omni.until("conversation.item.done")
    await omni.send({"type": "conversation.item.create", "event_id": "evt_out",
                     "item": {"type": "function_call_output", **item}})
    error, seen = await omni.until("error")
    assert error["error"] == {"type": "invalid_request_error", "code": "invalid_function_call_output",
                              "message": message, "event_id": "evt_out", "param": param}
    assert "conversation.item.added" not in [e["type"] for e in seen]


@pytest.mark.parametrize(("event", "code"), [
    ({"type": "session.update", "session": {"tools": "get_weather"}}, "invalid_tools"),
    ({"type": "session.update", "session": {"tools": [{**WEATHER, "parameters": {"type": "string"}}]}},
     "invalid_tools"),
    ({"type": "response.create", "response": {"tools": {"name": "get_weather"}}}, "invalid_tools"),
    ({"type": "response.create", "response": {"tool_choice": "maybe"}}, "invalid_tool_choice"),
])
async def test_bad_tools_are_refused_and_the_session_serves_on(our_server, event, code):
    _, client, _, _ = await our_server(CALL)
    omni = client()
    await omni.open(MANUAL)
    await omni.send({**event, "event_id": "evt_tools"})
    error, _ = await omni.until("error")
    assert error["error"]["code"] == code and error["error"]["event_id"] == "evt_tools"
    await omni.send({"type": "session.heartbeat"})
    await omni.until("session.heartbeat_ack")


async def test_a_model_without_tools_refuses_them(our_server):
    _, client, _, _ = await our_server(Script(supports_tools=False))
    omni = client()
    await omni.open(MANUAL)
    await omni.send({"type": "session.update", "event_id": "evt_tools", "session": {"tools": [WEATHER]}})
    error, _ = await omni.until("error")
    assert error["error"]["code"] == "tools_unsupported" and error["error"]["event_id"] == "evt_tools"
