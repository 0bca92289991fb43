"""The reference plugin's side of tools, without its models: who may call them, what its responder
remembers of calls and outputs, and what a continuation and a response's own tools submit."""

from __future__ import annotations

from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.plugins.contract import DuplexFence, DuplexSessionConfig
from duplex_agent.plugins.reference.plugin import RECOGNIZE, RESPOND, ReferenceOptions, ReferencePlugin

WEATHER = {"type": "function", "name": "get_weather", "description": "",
           "parameters": {"type": "object", "properties": {}}}
LOOKUP = {**WEATHER, "name": "lookup"}


def plugin(responder: str = "openai") -> ReferencePlugin:
    made = ReferencePlugin(as_float32_audio)
    made.configure(ReferenceOptions(responder=responder, openai_base_url="http://127.0.0.1:9/v1", openai_model="m"),
                   max_sessions=1)
    return made


def test_only_the_chat_responder_calls_tools():
    assert not plugin("echo").capabilities(max_sessions=1).supports_tools
    caps = plugin().capabilities(max_sessions=1)
    assert caps.supports_tools and not caps.replies_to_tool_output


def test_calls_join_the_words_said_before_them_and_outputs_follow():
    reference = plugin()
    reference.context("s1").history.append({"role": "user", "content": "weather in Paris and Rome?"})
    reference.commit_model_context(session_id="s1", assistant_text="Let me check.")
    for call_id, city in (("call_p", "Paris"), ("call_r", "Rome")):
        reference.commit_model_function_item(session_id="s1", item={
            "type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": f'{{"city": "{city}"}}'})
    reference.commit_model_function_item(session_id="s1", item={
        "type": "function_call_output", "call_id": "call_p", "output": "sunny"})
    reference.context("s1").history.append({"role": "user", "content": "thanks"})
    reference.commit_model_function_item(session_id="s1", item={
        "type": "function_call", "call_id": "call_t", "name": "get_time", "arguments": ""})
    assert reference.context("s1").history == [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_p", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_t", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    ]


async def test_a_continuation_starts_at_the_responder_with_the_tools_in_effect():
    reference = plugin()
    config = DuplexSessionConfig(instructions="be brief", extra_body={"realtime_tools": [WEATHER],
                                                                      "realtime_tool_choice": "required"})
    runtime = await reference.prepare_runtime_config(config, model_config=None)
    common = {"request_id": "s1-t1-cont-1", "fence": DuplexFence(2, 1), "session_config": {}, "runtime_config": runtime,
              "turn_seq": 1, "sampling_params": (None, "respond", None)}
    plan = reference.plan_response_continuation(response_options={}, **common)
    assert plan is not None and (plan.request_id, plan.stage_id, plan.final) == ("s1-t1-cont-1", RESPOND, True)
    assert plan.payload == {"continuation": True, "instructions": "be brief", "tools": [WEATHER],
                            "tool_choice": "required"}
    assert plan.sampling_params == "respond" and plan.fence == DuplexFence(2, 1)
    own = reference.plan_response_continuation(
        response_options={"realtime_response_tools": [LOOKUP], "realtime_response_tool_choice": "none"}, **common)
    assert own is not None and own.payload["tools"] == [LOOKUP] and own.payload["tool_choice"] == "none"


def test_a_responses_own_tools_go_with_its_transcript_to_the_responder():
    reference = plugin()
    heard = {"transcript": "hello", "instructions": "", "tools": [WEATHER], "tool_choice": "auto"}
    assert reference.plan_partial_stage_output(None, RECOGNIZE, 0, heard, {"finished": True}) is None  # as it is
    forward = reference.plan_partial_stage_output(None, RECOGNIZE, 0, heard, {
        "finished": True, "response_options": {"realtime_response_tools": [LOOKUP]}})
    assert forward is not None and forward.is_final_update
    assert forward.output == {**heard, "tools": [LOOKUP], "tool_choice": "auto"}
