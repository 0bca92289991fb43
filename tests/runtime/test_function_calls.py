"""A model's function calls through the runner: the call's own response, the client's outputs
(accepted and refused), the answer to them (a continuation), the bound on calls per reply, and
calls kept through a cancel. The runner runs on a virtual clock (nothing here waits on time)."""

from __future__ import annotations

import json
import logging

import pytest

from devtools.speech import speak
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.runner import DuplexSessionRunner
from duplex_agent.plugins.contract import DuplexRuntimeConfigError
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.runtime.conftest import TRANSPORTS
from tests.runtime.drivers import RunnerDriver
from tests.support.audio import tone

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SESSION = {"type": "session.update", "session": {"turn_detection": None, "tools": [WEATHER]}}
CALL_EVENTS = ["response.created", "conversation.item.added", "conversation.item.created",
               "response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done",
               "response.done"]


@pytest.fixture
async def session():
    """session(script) -> (driver, plugin): a runner on a virtual clock, configured with a tool."""
    opened: list = []

    async def open_session(script: Script, update: dict | None = None, plugin_type: type = ScriptedPlugin):
        plugin = plugin_type(as_float32_audio, script)
        backend = LocalBackend(plugin, plugin.build_local_engine())
        runner = DuplexSessionRunner(plugin, backend.engine, backend.capabilities, clock=lambda: 0.0)
        runner.start()
        driver = RunnerDriver(runner)
        opened.append((driver, backend))
        await driver.send(update or SESSION)
        await driver.until("session.created")
        return driver, plugin

    yield open_session
    for driver, backend in opened:
        await driver.close()
        await backend.close()


async def ask(driver) -> None:
    await driver.append(tone(200))
    await driver.send({"type": "input_audio_buffer.commit"})


async def until_spoken_done(driver) -> list[dict]:
    """Events up to the response.done of a spoken response (a call's own responses come inside it)."""
    seen: list[dict] = []
    while True:
        event = await driver.recv()
        seen.append(event)
        if event["type"] == "response.done" and event.get("function_call") is None:
            return seen


def call_groups(seen: list[dict]) -> dict[str, list[dict]]:
    """Each call response's events, by response id."""
    calls = {e["response_id"] for e in seen if e["type"] == "response.created" and e.get("function_call")}
    groups: dict[str, list[dict]] = {response_id: [] for response_id in calls}
    current = None
    for event in seen:
        if event["type"] == "response.created" and event["response_id"] in calls:
            current = event["response_id"]
        if current is not None:
            groups[current].append(event)
        if event["type"] == "response.done" and event["response_id"] == current:
            current = None
    return groups


async def output(driver, call_id: object, text: object = "sunny, 21 C", **item) -> None:
    await driver.send({"type": "conversation.item.create", "event_id": "evt_out",
                       "item": {"type": "function_call_output", "call_id": call_id, "output": text, **item}})


async def test_a_call_is_a_response_of_its_own_in_vllm_omnis_order(session):
    script = Script(reply="let me check", calls=[{"name": "get_weather", "arguments": {"city": "Paris"},
                                                  "call_id": "call_paris"}])
    driver, _ = await session(script)
    await ask(driver)
    seen = await until_spoken_done(driver)
    (group,) = call_groups(seen).values()
    assert [e["type"] for e in group] == CALL_EVENTS
    created, added, _, out_added, delta, args_done, out_done, item_done, done = group
    item = out_done["item"]
    assert item == {"id": item["id"], "object": "realtime.item", "type": "function_call", "status": "completed",
                    "name": "get_weather", "call_id": "call_paris", "arguments": json.dumps({"city": "Paris"})}
    assert added["item"] == out_added["item"] == item_done["item"] == done["function_call"] == item
    assert created["item_id"] == delta["item_id"] == args_done["item_id"] == item["id"]
    assert delta["delta"] == args_done["arguments"] == item["arguments"]
    assert delta["call_id"] == args_done["call_id"] == "call_paris"
    assert done["status"] == "completed"
    # Its words came first, and the reply that made the call ends after it.
    spoken = seen[-1]["response_id"]
    kinds = [(e["type"], e.get("response_id")) for e in seen]
    assert kinds.index(("response.output_audio.delta", spoken)) < kinds.index(("response.created",
                                                                                 created["response_id"]))
    # The conversation holds the user's turn, the heard words, then the call.
    runner = driver.runner
    assert [h.role for h in runner.history] == ["user", "assistant", "function_call"]
    assert added["previous_item_id"] == runner.history[1].item_id


async def test_an_output_is_announced_and_the_answer_speaks_it(session):
    script = Script(reply="let me check", calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}],
                    tool_reply="it is {output} in Paris")
    driver, plugin = await session(script)
    await ask(driver)
    seen = await until_spoken_done(driver)
    call = next(e for e in seen if e["type"] == "response.function_call_arguments.done")
    await output(driver, call["call_id"], "sunny", id="item_out1")
    done, kinds = await driver.until("conversation.item.done")
    assert [e["type"] for e in kinds] == ["conversation.item.added", "conversation.item.created",
                                          "conversation.item.done"]
    assert done["item"] == {"id": "item_out1", "object": "realtime.item", "type": "function_call_output",
                            "status": "completed", "call_id": call["call_id"], "output": "sunny", "content": []}
    assert done["previous_item_id"] == call["item_id"]
    # Nothing answers it until the client asks (this model does not reply to tool outputs by itself).
    await driver.send({"type": "input_dtmf", "digit": "1"})
    _, between = await driver.until("input_dtmf.received")
    assert "response.created" not in [e["type"] for e in between]
    await driver.send({"type": "response.create"})
    answer = await until_spoken_done(driver)
    said = " ".join(m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"])
    assert said == "it is sunny in Paris"
    assert answer[-1]["status"] == "completed"
    # The model was given the heard words, the call and its output, in that order, before answering.
    assert plugin.script.context == ["let me check", 'function_call get_weather {"city": "Paris"}',
                                     "function_call_output sunny"]
    assert [h.role for h in driver.runner.history] == ["user", "assistant", "function_call",
                                                      "function_call_output", "assistant"]


@pytest.mark.parametrize(("call_id", "text", "param", "message"), [
    ("call_unknown", "x", "item.call_id", "function_call_output requires the call_id of a completed function call"),
    (None, "x", "item.call_id", "function_call_output requires the call_id of a completed function call"),
    ("", "x", "item.call_id", "function_call_output requires the call_id of a completed function call"),
    ("call_known", {"temp": 21}, "item.output", "function_call_output requires a string output"),
    ("call_known", None, "item.output", "function_call_output requires a string output"),
])
async def test_a_bad_output_is_refused_and_the_session_serves_on(session, call_id, text, param, message):
    script = Script(reply="", calls=[{"name": "get_weather", "arguments": {}, "call_id": "call_known"}],
                    tool_reply="{output}")
    driver, plugin = await session(script)
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, call_id, text)
    error, seen = await driver.until("error")
    assert error["error"] == {"type": "invalid_request_error", "code": "invalid_function_call_output",
                              "message": message, "event_id": "evt_out", "param": param}
    assert "conversation.item.added" not in [e["type"] for e in seen]
    assert not plugin.script.context  # the model was given nothing
    # A good output for the same call still goes in, and is answered.
    await output(driver, "call_known", "good")
    await driver.until("conversation.item.done")
    await driver.send({"type": "response.create"})
    answer = await until_spoken_done(driver)
    assert [m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"]] == ["good"]


async def test_a_second_output_for_a_call_is_refused(session):
    driver, _ = await session(Script(reply="", calls=[{"name": "get_weather", "call_id": "call_once"}]))
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, "call_once", "first")
    await driver.until("conversation.item.done")
    await output(driver, "call_once", "again")
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "invalid_function_call_output" and error["error"]["param"] == "item.output"
    assert error["error"]["message"] == "function_call_output already exists for call_id call_once"
    outputs = [h for h in driver.runner.history if h.role == "function_call_output"]
    assert [h.function["output"] for h in outputs] == ["first"]


class PickyPlugin(ScriptedPlugin):
    """Refuses an output it cannot take, as a plugin may."""

    def runtime_config_for_function_output(self, config, current, item):
        if item.get("output") == "secret":
            raise DuplexRuntimeConfigError("this model takes no secrets", code="function_output_refused")
        return super().runtime_config_for_function_output(config, current, item)


async def test_the_plugin_may_refuse_an_output(session):
    script = Script(reply="", calls=[{"name": "get_weather", "call_id": "call_p"}], tool_reply="{output}")
    driver, _ = await session(script, plugin_type=PickyPlugin)
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, "call_p", "secret")
    error, seen = await driver.until("error")
    assert error["error"]["code"] == "function_output_refused" and error["error"]["event_id"] == "evt_out"
    assert "conversation.item.added" not in [e["type"] for e in seen]
    # Refused, the call still waits for an output: the next one goes in, and its value reaches the answer.
    await output(driver, "call_p", "public")
    await driver.until("conversation.item.done")
    await driver.send({"type": "response.create"})
    answer = await until_spoken_done(driver)
    assert [m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"]] == ["public"]


async def test_an_answer_asked_for_while_the_caller_speaks_waits_for_their_turn(session):
    script = Script(reply="ok", calls=[{"name": "get_weather"}], tool_reply="from the tool {output}")
    driver, _ = await session(script, {"type": "session.update", "session": {"tools": [WEATHER]}})  # server VAD
    await driver.append(speak("What is the weather in Paris?", before_ms=300, after_ms=1000))
    first = await until_spoken_done(driver)
    call = next(e for e in first if e["type"] == "response.function_call_arguments.done")
    await output(driver, call["call_id"], "sunny")
    await driver.until("conversation.item.done")
    more = speak("And what about tomorrow?", before_ms=0, after_ms=1000)
    await driver.append(more[:8000])
    await driver.until("input_audio_buffer.speech_started")
    await driver.send({"type": "response.create"})
    await driver.send({"type": "input_dtmf", "digit": "1"})
    _, between = await driver.until("input_dtmf.received")
    assert "response.created" not in [e["type"] for e in between]  # not over the caller
    await driver.append(more[8000:])
    second = await until_spoken_done(driver)
    kinds = [e["type"] for e in second]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    # The caller's turn was answered, with the output in the model's context; no second answer follows.
    assert [m["text"] for e in second if e["type"] == "response.output_audio.delta" for m in e["marks"]] == ["ok"]
    assert "function_call_output sunny" in driver.runner.plugin.script.context
    await driver.send({"type": "input_dtmf", "digit": "2"})
    _, after = await driver.until("input_dtmf.received")
    assert "response.created" not in [e["type"] for e in after]


async def test_a_reply_that_made_a_call_keeps_its_turn_when_the_caller_goes_on(session):
    # The reply calls before its first word, then holds: the caller goes on talking.
    script = Script(reply="checking", calls=[{"name": "get_weather", "call_id": "call_early"}],
                    calls_after_words=0, hold_after_words=0)
    driver, _ = await session(script, {"type": "session.update", "session": {"tools": [WEATHER]}})
    await driver.append(speak("What is the weather in Paris?", before_ms=300, after_ms=1000))
    await driver.until("response.function_call_arguments.done")
    await driver.append(speak("I mean in the south of France.", before_ms=0, after_ms=1000))
    seen = await until_spoken_done(driver)
    cancelled = seen[-1]
    assert cancelled["status"] == "cancelled" and cancelled["reason"] == "barge_in"
    # The turn that made the call stays in the conversation, before its call.
    assert "conversation.item.deleted" not in [e["type"] for e in seen]
    roles = [h.role for h in driver.runner.history]
    assert roles[:3] == ["user", "assistant", "function_call"], roles
    script.released.set()


async def test_response_create_with_nothing_new_to_answer_is_still_refused(session):
    driver, _ = await session(Script(reply="", calls=[{"name": "get_weather", "call_id": "call_a"}], tool_reply="ok"))
    await driver.send({"type": "response.create", "event_id": "evt_early"})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "no_committed_input" and error["error"]["event_id"] == "evt_early"
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, "call_a", "done")
    await driver.send({"type": "response.create"})
    await until_spoken_done(driver)
    # That output has its answer: a second response.create has nothing to answer.
    await driver.send({"type": "response.create", "event_id": "evt_again"})
    error, seen = await driver.until("error")
    assert error["error"]["code"] == "no_committed_input" and error["error"]["event_id"] == "evt_again"
    assert "response.created" not in [e["type"] for e in seen]


async def test_fifty_calls_in_one_reply_are_bounded(session, caplog):
    calls = [{"name": "get_weather", "arguments": {"city": f"city{n}"}} for n in range(50)]
    driver, _ = await session(Script(reply="checking", calls=calls))
    await ask(driver)
    with caplog.at_level(logging.WARNING, logger="duplex_agent.runner"):
        seen = await until_spoken_done(driver)
    groups = call_groups(seen)
    assert len(groups) == MAX_CALLS_PER_REPLY
    assert all([e["type"] for e in group] == CALL_EVENTS for group in groups.values())
    cities = [json.loads(g[-1]["function_call"]["arguments"])["city"] for g in groups.values()]
    assert sorted(cities) == sorted(f"city{n}" for n in range(MAX_CALLS_PER_REPLY))
    assert len({g[-1]["function_call"]["call_id"] for g in groups.values()}) == MAX_CALLS_PER_REPLY
    assert sum("is not announced" in r.getMessage() for r in caplog.records) == 50 - MAX_CALLS_PER_REPLY
    assert seen[-1]["status"] == "completed"
    # The next reply has its own bound.
    await ask(driver)
    assert len(call_groups(await until_spoken_done(driver))) == MAX_CALLS_PER_REPLY


async def test_a_call_announced_before_a_cancel_is_kept(session):
    script = Script(reply="let me look that up for you", calls=[{"name": "get_weather", "call_id": "call_kept"}],
                    calls_after_words=2, hold_after_words=2, tool_reply="found {output}")
    driver, plugin = await session(script)
    await ask(driver)
    done, seen = await driver.until("response.done")
    assert done["function_call"]["call_id"] == "call_kept"
    spoken = next(e["response_id"] for e in seen if e["type"] == "response.created" and not e.get("function_call"))
    await driver.send({"type": "response.cancel"})
    cancelled, _ = await driver.until("response.done")
    assert cancelled["response_id"] == spoken and cancelled["status"] == "cancelled"
    script.released.set()
    # The call is still in the conversation: its output goes in and gets its answer.
    call_item = next(h.item_id for h in driver.runner.history if h.role == "function_call")
    await driver.send({"type": "conversation.item.retrieve", "item_id": call_item})
    retrieved, _ = await driver.until("conversation.item.retrieved")
    assert retrieved["item"]["call_id"] == "call_kept" and retrieved["item"]["type"] == "function_call"
    await output(driver, "call_kept", "it")
    await driver.send({"type": "response.create"})
    answer = await until_spoken_done(driver)
    assert [m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"]] == \
        ["found", "it"]
    assert plugin.script.context == ["let me", "function_call get_weather {}", "function_call_output it"]


async def test_a_model_that_replies_to_outputs_answers_once_every_call_has_one(session):
    script = Script(reply="", calls=[{"name": "get_weather", "call_id": "call_1"},
                                     {"name": "get_weather", "call_id": "call_2"}],
                    replies_to_tool_output=True, tool_reply="both {output}")
    driver, _ = await session(script)
    caps = driver.runner.capabilities
    assert caps.replies_to_tool_output
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, "call_1", "one")
    await driver.send({"type": "input_dtmf", "digit": "1"})
    _, between = await driver.until("input_dtmf.received")
    assert "response.created" not in [e["type"] for e in between]  # call_2 still waits for its output
    await output(driver, "call_2", "two")
    answer = await until_spoken_done(driver)  # no response.create: the model answers by itself
    assert [m["text"] for e in answer if e["type"] == "response.output_audio.delta" for m in e["marks"]] == \
        ["both", "two"]


async def test_response_create_gives_the_continuation_its_own_tools(session):
    driver, plugin = await session(Script(reply="", calls=[{"name": "get_weather", "call_id": "call_t"}]))
    await ask(driver)
    await until_spoken_done(driver)
    await output(driver, "call_t", "x")
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    await driver.send({"type": "response.create", "response": {"tools": [lookup], "tool_choice": "required"}})
    await until_spoken_done(driver)
    (options,) = plugin.script.continuation_options
    assert options == {"realtime_response_tools": [{**lookup, "description": ""}],
                       "realtime_response_tool_choice": "required"}


@pytest.mark.parametrize(("response", "code"), [
    ({"tools": {"name": "x"}}, "invalid_tools"),
    ({"tools": [{"type": "function", "name": "x", "parameters": {"type": "string"}}]}, "invalid_tools"),
    ({"tool_choice": "sometimes"}, "invalid_tool_choice"),
])
async def test_bad_tools_in_response_create_are_refused(session, response, code):
    driver, _ = await session(Script())
    await driver.send({"type": "response.create", "event_id": "evt_bad", "response": response})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == code and error["error"]["event_id"] == "evt_bad"


async def test_a_model_without_tools_refuses_them_in_response_create(session):
    driver, _ = await session(Script(supports_tools=False), {"type": "session.update",
                                                             "session": {"turn_detection": None}})
    await ask(driver)
    await driver.send({"type": "response.create", "event_id": "evt_t", "response": {"tools": [WEATHER]}})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "tools_unsupported" and error["error"]["event_id"] == "evt_t"


async def test_a_model_that_cannot_continue_says_so(session):
    # A continuous model: the client seeds a call of its own, answers it, and asks for a reply.
    driver, _ = await session(Script(input_mode="continuous"), {"type": "session.update",
                                                                "session": {"turn_detection": None}})
    await driver.send({"type": "conversation.item.create",
                       "item": {"type": "function_call", "call_id": "call_seed", "name": "get_weather",
                                "arguments": "{}"}})
    await driver.until("conversation.item.done")
    await output(driver, "call_seed", "seeded")
    await driver.until("conversation.item.done")
    await driver.send({"type": "response.create", "event_id": "evt_c"})
    error, seen = await driver.until("error")
    assert error["error"]["code"] == "response_continuation_unsupported" and error["error"]["event_id"] == "evt_c"
    assert "response.created" not in [e["type"] for e in seen]


@TRANSPORTS
@pytest.mark.parametrize(("tools", "message"), [
    ({"type": "function", "name": "get_weather"}, "tools must be a list"),
    ([{"type": "function", "name": "get_weather", "parameters": ["city"]}], "must be a JSON schema of type 'object'"),
    ([{"type": "function", "name": "get_weather", "parameters": {"type": "array"}}],
     "must be a JSON schema of type 'object'"),
])
async def test_bad_tools_in_session_update_are_invalid_tools_on_the_wire(open_driver, transport, tools, message):
    driver, _, _ = await open_driver(Script(), transport=transport)
    await driver.send({"type": "session.update", "session": {"turn_detection": None}})
    await driver.until("session.created")
    await driver.send({"type": "session.update", "event_id": "evt_tools", "session": {"tools": tools}})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "invalid_tools" and error["error"]["event_id"] == "evt_tools"
    assert message in error["error"]["message"]
    # The session serves on, without tools, until a good update gives it some.
    await driver.send({"type": "session.update", "session": {"instructions": "still here"}})
    updated, _ = await driver.until("session.updated")
    assert "tools" not in updated["session"] and updated["session"]["instructions"] == "still here"
    await driver.send({"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": "auto"}})
    updated, _ = await driver.until("session.updated")
    assert updated["session"]["tools"] == [WEATHER] and updated["session"]["tool_choice"] == "auto"
