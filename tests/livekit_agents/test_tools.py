"""The DuplexModel runs an Agent's ``@function_tool``s: their schemas go to the model in
session.update, the model's calls reach livekit-agents as FunctionCalls, the outputs go back
as function_call_output items, and the model is asked to answer them only where it does not
by itself; a model that cannot call tools says so."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from livekit.agents import Agent, AgentSession, function_tool, llm

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.options import RemoteOptions
from duplex_agent.livekit_agents import DuplexModel, ToolsUnsupportedError
from duplex_agent.livekit_agents.gate import ResponseGate
from duplex_agent.livekit_agents.model_calls import ModelCalls
from duplex_agent.livekit_agents.session import DuplexAgentSession, SessionPlan
from tests.livekit_agents.tool_fakes import TOOL_CAPS, OneConversationBackend, call_events, model_on
from tests.support.waits import until
from tests.webrtc.fakes import CAPS


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city today.

    Args:
        city: The city's name.
    """
    return f"sunny and 21 degrees in {city}"


def _updates(conversation, key: str) -> list:
    return [e.session[key] for e in conversation.sent_of(p.SessionUpdate) if key in e.session]


async def _open(backend: OneConversationBackend, *, tools=(get_weather,), turn_detection=None) -> DuplexAgentSession:
    model = model_on(backend)
    session = DuplexAgentSession(model, SessionPlan(backend, turn_detection=turn_detection), gate=ResponseGate())
    await session._update_session(instructions="Help.", tools=list(tools))
    await asyncio.wait_for(session._ready.wait(), 120)  # the call path's VAD loads first
    assert session._conversation is not None
    return session


async def _emit(conversation, events) -> None:
    for event in events:
        conversation.emit(event)
    await conversation.handled()


async def test_the_agents_tools_go_to_the_model_as_livekit_agents_builds_their_schemas():
    backend = OneConversationBackend()
    session = await _open(backend)
    try:
        (tools,) = _updates(backend.conversation, "tools")
        assert tools == llm.ToolContext([get_weather]).parse_function_tools("openai.responses")
        (weather,) = tools
        assert weather["type"] == "function" and weather["name"] == "get_weather"
        assert "weather" in weather["description"]
        assert weather["parameters"]["properties"]["city"]["type"] == "string"
        assert weather["parameters"]["required"] == ["city"]
        # a change mid-session goes at once; taking them all away says so too
        await session._update_tools([])
        assert _updates(backend.conversation, "tools")[-1] == []
        session._update_options(tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert _updates(backend.conversation, "tool_choice") == [{"type": "function", "name": "get_weather"}]
        # livekit-agents' "no preference" is the wire's default; the same choice again sends nothing
        session._update_options(tool_choice=None)
        session._update_options(tool_choice="auto")
        assert _updates(backend.conversation, "tool_choice")[1:] == ["auto"]
        assert session.tools.function_tools == {}
    finally:
        await session.aclose()


async def test_a_call_reaches_livekit_agents_once_whole_with_the_models_item_id():
    backend = OneConversationBackend()
    session = await _open(backend)
    calls: list[llm.FunctionCall] = []
    session.on("function_call", calls.append)
    try:
        events = call_events("call-1", "get_weather", {"city": "Paris"})
        await _emit(backend.conversation, events)
        assert [(c.call_id, c.name, c.arguments, c.id) for c in calls] == \
            [("call-1", "get_weather", '{"city": "Paris"}', "item-call-1")]
        # a resumed socket replays what the client missed: the call is not handed on again
        await _emit(backend.conversation, events)
        assert len(calls) == 1
        # a call the model was cut off in (its item incomplete) is none
        cut = call_events("call-2", "get_weather", {"city": "Rome"}, response_id="resp-2")
        done = next(e for e in cut if isinstance(e, p.ResponseOutputItemDone))
        done.item["status"] = "incomplete"
        await _emit(backend.conversation, cut)
        assert len(calls) == 1
    finally:
        await session.aclose()


async def test_outputs_go_back_once_per_call_and_the_model_is_asked_to_answer_them():
    backend = OneConversationBackend()
    conversation = backend.conversation
    session = await _open(backend)
    try:
        with pytest.raises(llm.RealtimeError, match="decides for itself"):
            session._generate_reply()  # nothing to answer: the model speaks when it will
        await _emit(conversation, call_events("call-1", "get_weather", {"city": "Paris"}))
        output = llm.FunctionCallOutput(call_id="call-1", name="get_weather", output="sunny", is_error=False)
        await session._append_items([output])
        await session._append_items([output.model_copy()])  # the wire refuses a second answer
        created = [e.item for e in conversation.sent_of(p.ConversationItemCreate)]
        assert created == [{"type": "function_call_output", "call_id": "call-1", "output": "sunny"}]
        session._generate_reply()
        assert conversation.sent_of(p.ResponseCreate) and conversation.sent_of(p.ResponseCreate)[-1].response is None
        # a call and its output from elsewhere (a handed-over history) are told as text, not refused
        await session._append_items([
            llm.FunctionCall(call_id="old", name="get_weather", arguments='{"city": "Oslo"}'),
            llm.FunctionCallOutput(call_id="old", name="get_weather", output="snow", is_error=False)])
        told = [e.item for e in conversation.sent_of(p.ConversationItemCreate)][1:]
        assert [i["role"] for i in told] == ["system", "system"]
        assert "Oslo" in told[0]["content"][0]["text"] and "snow" in told[1]["content"][0]["text"]
        assert len(conversation.sent_of(p.ConversationItemCreate)) == 3
    finally:
        await session.aclose()


async def test_a_model_that_answers_tool_outputs_by_itself_is_not_asked_again():
    backend = OneConversationBackend(dataclasses.replace(TOOL_CAPS, replies_to_tool_output=True))
    session = await _open(backend)
    try:
        await _emit(backend.conversation, call_events("call-1", "get_weather", {"city": "Paris"}))
        await session._append_items([llm.FunctionCallOutput(call_id="call-1", output="sunny", is_error=False)])
        session._generate_reply()  # an app's ask is answered by the model's own reply
        assert backend.conversation.sent_of(p.ConversationItemCreate)
        assert not backend.conversation.sent_of(p.ResponseCreate)
    finally:
        await session.aclose()


async def test_a_caller_talking_when_the_answer_is_asked_for_is_not_talked_over():
    for turn_detection, sent_at_end in ((None, 0), ({"type": "server_vad", "create_response": False}, 1)):
        backend = OneConversationBackend()
        conversation = backend.conversation
        session = await _open(backend, turn_detection=turn_detection)
        try:
            await _emit(conversation, call_events("call-1", "get_weather", {"city": "Paris"}))
            await _emit(conversation, [p.SpeechStarted(audio_start_ms=1000.0)])  # over the agent, the tool running
            await session._append_items([llm.FunctionCallOutput(call_id="call-1", output="sunny", is_error=False)])
            session._generate_reply()
            # the output is in the model's history at once; the ask waits for the caller's turn to end
            assert conversation.sent_of(p.ConversationItemCreate) and not conversation.sent_of(p.ResponseCreate)
            await _emit(conversation, [p.SpeechStopped(audio_end_ms=2000.0)])
            # server VAD answers the caller's turn itself, the output in its history: no second response
            assert len(conversation.sent_of(p.ResponseCreate)) == sent_at_end, turn_detection
        finally:
            await session.aclose()


async def test_an_in_process_model_that_cannot_call_tools_refuses_them_at_start():
    model = DuplexModel.in_process("reference")  # its default responder says back what it heard
    assert model.calls_tools is False
    assert not model.capabilities.auto_tool_reply_generation and model.capabilities.mutable_tools
    session = model.session()
    try:
        with pytest.raises(ToolsUnsupportedError, match="'reference' cannot call tools") as refused:
            await session._update_tools([get_weather])
        assert refused.value.code == "tools_unsupported" and isinstance(refused.value, llm.RealtimeError)
        await session._update_tools([])  # no tools is fine
        session._update_options(tool_choice="auto")  # and asking for none is too
        with pytest.raises(ToolsUnsupportedError):
            session._update_options(tool_choice="required")
    finally:
        await session.aclose()


async def test_a_server_that_cannot_call_tools_ends_the_session_saying_so_once_it_is_known():
    backend = OneConversationBackend(CAPS, known=False)
    session = DuplexAgentSession(model_on(backend), SessionPlan(backend), gate=ResponseGate())
    errors: list[llm.RealtimeModelError] = []
    session.on("error", errors.append)
    try:
        await session._update_session(instructions="Help.", tools=[get_weather])  # its model not known yet
        await asyncio.wait_for(session._ready.wait(), 120)
        assert [(type(e.error), e.error.code, e.recoverable) for e in errors] == \
            [(ToolsUnsupportedError, "tools_unsupported", False)]
        assert "'fake' cannot call tools" in str(errors[0].error)
        assert not _updates(backend.conversation, "tools")  # never sent to a model that refuses them
    finally:
        await session.aclose()


def test_auto_tool_reply_generation_is_the_backends_truth():
    for replies in (False, True):
        backend = OneConversationBackend(dataclasses.replace(TOOL_CAPS, replies_to_tool_output=replies))
        assert model_on(backend).capabilities.auto_tool_reply_generation is replies
    unknown = OneConversationBackend(known=False)
    model = model_on(unknown)
    assert model.calls_tools is None
    assert not model.capabilities.auto_tool_reply_generation  # asked, until the server is known
    unknown.known_capabilities = dataclasses.replace(TOOL_CAPS, replies_to_tool_output=True)
    assert model.capabilities.auto_tool_reply_generation  # the next AgentSession is told
    # a vLLM-Omni server names no tool capability: the app's word stands until a session says otherwise
    remote = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1",
                         options=RemoteOptions(tools=True, replies_to_tool_output=True))
    assert remote.calls_tools is True and remote.capabilities.auto_tool_reply_generation
    assert DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1").calls_tools is None


async def test_an_agent_session_runs_the_tool_sends_its_output_and_asks_for_the_answer():
    backend = OneConversationBackend()
    conversation = backend.conversation
    model = model_on(backend)
    ran: list[str] = []

    class Weather(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="Answer about the weather.")

        @function_tool
        async def get_weather(self, city: str) -> str:
            """The weather in a city today.

            Args:
                city: The city's name.
            """
            ran.append(city)
            return f"sunny and 21 degrees in {city}"

    session = AgentSession(llm=model, aec_warmup_duration=None)
    model.attach(session)
    await session.start(agent=Weather())
    duplex: DuplexAgentSession = session.current_agent.duplex_session
    try:
        await asyncio.wait_for(duplex._ready.wait(), 120)
        assert [t["name"] for t in _updates(conversation, "tools")[-1]] == ["get_weather"]
        await _emit(conversation, call_events("call-1", "get_weather", {"city": "Paris"}))
        await until(lambda: conversation.sent_of(p.ResponseCreate), 20, "the ask for the answer")
        assert ran == ["Paris"]
        outputs = [e.item for e in conversation.sent_of(p.ConversationItemCreate)]
        assert outputs == [{"type": "function_call_output", "call_id": "call-1",
                            "output": "sunny and 21 degrees in Paris"}]
        # the call and its output are in the session's history, in order
        items = [i for i in session.history.items if i.type in ("function_call", "function_call_output")]
        assert [(i.type, i.call_id) for i in items] == [("function_call", "call-1"),
                                                         ("function_call_output", "call-1")]

        # the model answers: its words reach the session's history as the reply asked for
        answer = "It is sunny and 21 degrees in Paris."
        audio = (0.2 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32)
        await _emit(conversation, [
            p.ResponseCreated(response_id="resp-answer", item_id="item-answer"),
            p.ResponseAudioDelta("resp-answer", "item-answer", audio, 24000, 0.0, 1000.0,
                                 [{"text": answer, "start_ms": 0.0, "end_ms": 1000.0}]),
            p.ResponseAudioDone("resp-answer", "item-answer"),
            p.ResponseDone(response_id="resp-answer", status="completed")])

        def answered() -> bool:
            return any(i.type == "message" and i.role == "assistant" and "sunny" in (i.text_content or "")
                       for i in session.history.items)

        await until(answered, 20, "the answer in the session's history")
    finally:
        await session.aclose()


async def test_a_barge_in_while_the_tool_runs_still_gives_the_model_its_output_and_asks_nothing():
    backend = OneConversationBackend()
    conversation = backend.conversation
    model = model_on(backend)
    release = asyncio.Event()
    started: list[str] = []

    class Weather(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="Answer about the weather.")

        @function_tool
        async def get_weather(self, city: str) -> str:
            """The weather in a city today.

            Args:
                city: The city's name.
            """
            started.append(city)
            await release.wait()
            return f"sunny in {city}"

    session = AgentSession(llm=model, aec_warmup_duration=None)
    model.attach(session)
    await session.start(agent=Weather())
    duplex: DuplexAgentSession = session.current_agent.duplex_session
    try:
        await asyncio.wait_for(duplex._ready.wait(), 120)
        # the model says it will look, and calls the tool while that plays
        hum = (0.2 * np.sin(2 * np.pi * 220 * np.arange(24000 * 4) / 24000)).astype(np.float32)
        await _emit(conversation, [
            p.ResponseCreated(response_id="resp-talk", item_id="item-talk"),
            p.ResponseAudioDelta("resp-talk", "item-talk", hum, 24000, 0.0, 4000.0,
                                 [{"text": "Let me look that up for you.", "start_ms": 0.0, "end_ms": 4000.0}])])
        await until(lambda: duplex._gate.open_for == "resp-talk" and duplex.link_session() is not None, 20,
                    "the talk to play")
        await _emit(conversation, call_events("call-1", "get_weather", {"city": "Paris"}))
        await until(lambda: started, 20, "the tool to start")
        # the caller talks over the agent: the playout is cleared, the AgentSession interrupted
        await _emit(conversation, [p.OutputAudioBufferCleared()])
        assert "resp-talk" in duplex._cut
        release.set()
        await until(lambda: conversation.sent_of(p.ConversationItemCreate), 20, "the output on the wire")
        assert [e.item for e in conversation.sent_of(p.ConversationItemCreate)] == \
            [{"type": "function_call_output", "call_id": "call-1", "output": "sunny in Paris"}]
        # the history holds the call and what it returned, as the model's does
        await until(lambda: any(i.type == "function_call_output" for i in session.history.items), 20,
                    "the output in the session's history")
        # the caller has the floor: once the interrupted turn is over, nothing asked the model to
        # answer over them; it answers their turn, the output in its history
        await until(lambda: session.current_speech is None, 20, "the interrupted turn to end")
        assert not conversation.sent_of(p.ResponseCreate)
    finally:
        await session.aclose()


def test_a_long_conversation_forgets_its_oldest_calls_and_their_answers_alike():
    calls = ModelCalls()
    first = call_events("call-0", "get_weather", {"city": "Paris"})
    assert calls.take(next(e for e in first if isinstance(e, p.ResponseOutputItemDone))) is not None
    assert calls.answer("call-0") and not calls.answer("call-0")
    for n in range(1, 1025):
        done = next(e for e in call_events(f"call-{n}", "get_weather", {}) if isinstance(e, p.ResponseOutputItemDone))
        calls.take(done)
    # the oldest is forgotten whole: neither made nor answered (a stray late output is refused)
    assert not calls.made("call-0") and not calls.answer("call-0") and "call-0" not in calls._answered
    assert calls.made("call-1024") and calls.answer("call-1024")
