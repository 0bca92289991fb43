"""Tools through the remote backend: vLLM-Omni's function-call events in our vocabulary, each call
passed on once and bounded per reply, tools and outputs on the wire as vLLM-Omni takes them.

The server here is a small stand-in speaking vLLM-Omni 0.30.0's shapes (``fake_server``); the same
against the real server is ``tests/omni_peer/test_tools.py``.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from devtools.speech import speak
from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.agent.remote.events import ServerMessageReader
from duplex_agent.agent.remote.failover import FailoverConversation
from duplex_agent.agent.remote.session import parse_session_created
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.toolbox import EdgeToolOptions, ToolBox
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE
from tests.remote.conversation_events import events_until
from tests.support.audio import tone
from tests.support.waits import until
from tests.tools import toolkit
from tests.tools.harness import FakeControl
from tests.webrtc.fakes import EnergyVadModel

from .fake_server import (
    OMNI_CAPS,
    FakeServer,
    FakeSession,
    drop_connection,
    function_call_messages,
    session_created,
)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
#: A vLLM-Omni plugin whose stage request resumes (Nemotron VoiceChat's): it answers outputs itself.
RESUMABLE = {**OMNI_CAPS, "supports_core_resumable_request": True}
CALL_ORDER = [p.ResponseCreated, p.ConversationItemAdded, p.ResponseOutputItemAdded,
              p.ResponseFunctionCallArgumentsDelta, p.ResponseFunctionCallArgumentsDone, p.ResponseOutputItemDone,
              p.ConversationItemDone, p.ResponseDone]


def read_all(reader: ServerMessageReader, messages: list[dict]) -> list[p.ServerEvent]:
    return [event for message in messages for event in reader.read(message)]


def test_a_vllm_omni_call_becomes_our_events_in_its_order_with_the_calls_item():
    reader = ServerMessageReader(24000)
    events = read_all(reader, function_call_messages("resp_c1", "item_c1", "call_1"))
    assert [type(e) for e in events] == CALL_ORDER
    created, added, _, delta, done, _, item_done, finished = events
    assert isinstance(added, p.ConversationItemAdded) and added.item["call_id"] == "call_1"
    # The call's item, not a reply's: the response is that call alone.
    assert created == p.ResponseCreated("resp_c1", "item_c1", function_call=added.item)
    assert isinstance(delta, p.ResponseFunctionCallArgumentsDelta) and delta.delta == '{"city":"Paris"}'
    assert done == p.ResponseFunctionCallArgumentsDone("resp_c1", "item_c1", "call_1", '{"city":"Paris"}')
    assert isinstance(item_done, p.ConversationItemDone) and item_done.item["name"] == "get_weather"
    assert finished == p.ResponseDone("resp_c1", "completed", "completed", function_call=added.item)
    # A spoken reply's response.created keeps its own item; its message items stay unseen as before.
    spoken = read_all(reader, [
        {"type": "response.created", "response_id": "r2", "response": {"id": "r2", "output": []}},
        {"type": "conversation.item.added", "item": {"id": "item_r2", "type": "message", "role": "assistant"}},
        {"type": "response.output_item.added", "response_id": "r2",
         "item": {"id": "item_r2", "type": "message", "role": "assistant"}}])
    assert spoken == [p.ResponseCreated("r2", "item_r2")]
    # An output's echo says the server took it.
    [echo] = reader.read({"type": "conversation.item.added", "previous_item_id": "item_c1", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": "sunny", "id": "item_o1"}})
    assert isinstance(echo, p.ConversationItemAdded) and echo.item["id"] == "item_o1"


@pytest.mark.parametrize(("caps", "expected"), [
    (OMNI_CAPS, (False, False)),  # a turn-based plugin: vLLM-Omni refuses the response.create after an output
    (RESUMABLE, (True, True)),  # it continues the model's request after an output
    ({**OMNI_CAPS, "supports_tools": True, "replies_to_tool_output": False}, (True, False)),  # ours says both
])
def test_tool_capabilities_of_a_remote_server(caps, expected):
    remote = parse_session_created(session_created(caps=caps), model="", max_sessions=1)
    assert (remote.capabilities.supports_tools, remote.capabilities.replies_to_tool_output) == expected


@pytest.fixture
async def remote():
    """remote(caps, **options) -> (conversation, the server's session); the server records what comes."""
    made: list[tuple[FakeServer, RemoteBackend]] = []

    async def open_with(caps: dict, **options):
        sessions: list[FakeSession] = []

        async def handler(ws, request):
            session = FakeSession()
            session.ws = ws
            sessions.append(session)
            await session.until("session.update")
            await ws.send_str(json.dumps(session.stamp(session_created(caps=caps))))
            while await session.receive(timeout=30) is not None:
                pass

        server = await FakeServer(handler).start()
        backend = RemoteBackend(server.url, options=RemoteOptions(**options))
        made.append((server, backend))
        conversation = await backend.open()
        return conversation, sessions[-1]

    yield open_with
    for server, backend in made:
        await backend.close()
        await server.close()


async def error_of(conversation, seen: list[p.ServerEvent]) -> p.ErrorEvent:
    event = await events_until(conversation, lambda e: isinstance(e, p.ErrorEvent), seen)
    assert isinstance(event, p.ErrorEvent)
    return event


async def test_tools_go_in_session_update_and_response_create_checked_before_anything_is_sent(remote):
    conversation, session = await remote(RESUMABLE)
    seen: list[p.ServerEvent] = []
    # Bad input is a typed error here, and nothing goes to the server.
    conversation.send(p.SessionUpdate({"tools": {"name": "get_weather"}}, event_id="evt_bad"))
    bad = await error_of(conversation, seen)
    assert (bad.code, bad.error["event_id"]) == ("invalid_tools", "evt_bad")
    conversation.send(p.SessionUpdate({"tools": [{**WEATHER, "parameters": {"type": "array"}}]}))
    assert (await error_of(conversation, seen)).code == "invalid_tools"
    conversation.send(p.ResponseCreate(response={"tool_choice": "sometimes"}))
    assert (await error_of(conversation, seen)).code == "invalid_tool_choice"
    # Good ones go as vLLM-Omni carries them: tools and tool_choice in the session and the response.
    nested = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    conversation.send(p.SessionUpdate({"tools": [nested], "tool_choice": "auto", "instructions": "be brief"}))
    conversation.send(p.ResponseCreate(response={"tool_choice": {"type": "function", "name": "get_weather"}}))
    await until(lambda: len(session.received_of("response.create")) == 1, 10.0, "the response.create")
    [opening, update] = session.received_of("session.update")
    assert "tools" not in opening["session"]
    assert update["session"] == {"tools": [WEATHER], "tool_choice": "auto", "instructions": "be brief"}
    [create] = session.received_of("response.create")
    assert create["response"] == {"tool_choice": {"type": "function", "name": "get_weather"}}
    await conversation.close()


async def test_a_model_that_cannot_call_tools_refuses_them_here(remote):
    conversation, session = await remote(OMNI_CAPS)
    assert not conversation.capabilities.supports_tools
    seen: list[p.ServerEvent] = []
    conversation.send(p.SessionUpdate({"tools": [WEATHER], "instructions": "x"}, event_id="evt_t"))
    refused = await error_of(conversation, seen)
    assert (refused.code, refused.error["event_id"]) == ("tools_unsupported", "evt_t")
    conversation.send(p.SessionUpdate({"tools": []}))  # no tools is no request for them
    await until(lambda: len(session.received_of("session.update")) == 2, 10.0, "the empty tools")
    await conversation.close()
    # The operator's word stands where the server says nothing.
    told, _ = await remote(OMNI_CAPS, tools=True, replies_to_tool_output=False)
    assert told.capabilities.supports_tools and not told.capabilities.replies_to_tool_output
    await told.close()


async def test_each_call_is_passed_on_once_and_at_most_the_bound_per_reply(remote):
    conversation, session = await remote(RESUMABLE)
    seen: list[p.ServerEvent] = []
    extra = 3
    calls = [f"call_{n}" for n in range(MAX_CALLS_PER_REPLY + extra)]
    # One reply's calls (vLLM-Omni: one response each), then the first announced again.
    for n, call_id in enumerate([*calls, calls[0]]):
        for message in function_call_messages(f"resp_{n}", f"item_{n}", call_id):
            await session.send(message)
    await session.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "u2"})
    await events_until(conversation, lambda e: isinstance(e, p.SpeechStarted), seen)
    announced = [e.call_id for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]
    assert announced == calls[:MAX_CALLS_PER_REPLY]
    # Whole responses or none: nothing of a refused or repeated call reaches the transport.
    assert len([e for e in seen if isinstance(e, p.ResponseCreated)]) == MAX_CALLS_PER_REPLY
    assert [type(e) for e in seen[:len(CALL_ORDER)]] == CALL_ORDER
    # The model gets an error output for each call it was refused, and their echoes stay here.
    await until(lambda: len(session.received_of("conversation.item.create")) == extra, 10.0, "the refusals")
    refusals = session.received_of("conversation.item.create")
    assert [m["item"]["call_id"] for m in refusals] == calls[MAX_CALLS_PER_REPLY:]
    assert all(json.loads(m["item"]["output"])["error"]["code"] == "too_many_function_calls" for m in refusals)
    for refusal in refusals:
        await session.send({"type": "conversation.item.added", "item": {**refusal["item"], "status": "completed"}})
    # The caller's next turn is a new reply: its calls pass again.
    await session.send({"type": "input_audio_buffer.committed", "item_id": "u2", "previous_item_id": None})
    for message in function_call_messages("resp_next", "item_next", "call_next"):
        await session.send(message)
    await events_until(conversation, lambda e: isinstance(e, p.ResponseDone) and e.response_id == "resp_next", seen)
    assert not [e for e in seen if isinstance(e, p.ConversationItemAdded)
                and e.item.get("type") == "function_call_output"]
    await conversation.close()


async def test_an_output_goes_as_given_and_its_refusals_come_back_with_the_transports_event(remote):
    conversation, session = await remote(RESUMABLE)
    seen: list[p.ServerEvent] = []
    conversation.send(p.ConversationItemCreate({"type": "function_call_output", "call_id": "call_1",
                                                "output": "sunny"}, event_id="evt_o1"))
    conversation.send(p.ConversationItemCreate({"type": "function_call_output", "call_id": "call_x",
                                                "output": "rain"}))
    await until(lambda: len(session.received_of("conversation.item.create")) == 2, 10.0, "the outputs")
    first, second = session.received_of("conversation.item.create")
    assert first["event_id"] == "evt_o1" and first["item"]["output"] == "sunny"
    assert first["item"]["type"] == "function_call_output" and first["item"]["id"]
    # vLLM-Omni's refusal of the second; the transport named no event, so the error names none.
    await session.send({"type": "error", "error": {
        "type": "invalid_request_error", "code": "invalid_function_call_output", "param": "item.call_id",
        "message": "function_call_output requires the call_id of a completed function call",
        "event_id": second["event_id"]}})
    refused = await error_of(conversation, seen)
    assert refused.code == "invalid_function_call_output" and refused.error["event_id"] is None
    await conversation.close()


async def test_an_output_sent_again_after_a_resume_is_not_refused_to_the_transport():
    """The socket drops after the server took an output but before the receipt behind it: the outbox
    sends it again, the server refuses the copy as a second output, and the transport sees one output."""
    session = FakeSession()

    async def handler(ws, request):
        session.ws = ws
        first = await session.receive()
        assert first is not None
        if first["type"] == "session.update":
            await session.send(session_created(caps=RESUMABLE, token="tok-1"))
            for message in function_call_messages("resp_c1", "item_c1", "call_1"):
                await session.send(message)
            output = await session.until("conversation.item.create")
            await session.send({"type": "conversation.item.added", "item": {**output["item"], "status": "completed"}})
            drop_connection(ws, request)  # before the heartbeat written behind the output is read
            return
        await ws.send_str(json.dumps({"type": "session.resumed", "session_id": "duplex-1", "resume_token": "tok-2",
                                      "attachment_generation": 2, "session": {"id": "duplex-1"}}))
        copy = await session.until("conversation.item.create")
        await session.send({"type": "error", "error": {
            "type": "invalid_request_error", "code": "invalid_function_call_output", "param": "item.output",
            "message": "function_call_output already exists for call_id call_1", "event_id": copy["event_id"]}})
        while await session.receive(timeout=30) is not None:
            pass

    server = await FakeServer(handler).start()
    backend = RemoteBackend(server.url, options=RemoteOptions(resume_backoff_s=0.05))
    try:
        conversation = await backend.open()
        seen: list[p.ServerEvent] = []
        await events_until(conversation, lambda e: isinstance(e, p.ResponseFunctionCallArgumentsDone), seen)
        conversation.send(p.ConversationItemCreate({"type": "function_call_output", "call_id": "call_1",
                                                    "output": "sunny"}, event_id="evt_o1"))
        await until(lambda: conversation.resumes == 1, 10.0, "the resume")
        await until(lambda: len(session.received_of("conversation.item.create")) == 2, 10.0, "the copy")
        conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id="evt_after"))
        await events_until(conversation, lambda e: isinstance(e, p.ErrorEvent) and e.code == "item_not_found", seen)
        assert [e.code for e in seen if isinstance(e, p.ErrorEvent)] == ["item_not_found"]
        assert len([e for e in seen if isinstance(e, p.ConversationItemAdded)
                    and e.item.get("type") == "function_call_output"]) == 1
        assert len([e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]) == 1
        await conversation.close()
    finally:
        await backend.close()
        await server.close()


class Host:
    """One backend host for a moving call: announces a call, may take an output, then dies (no resume)."""

    def __init__(self, *, announce: bool, dies_after_output: bool) -> None:
        self.announce = announce
        self.dies_after_output = dies_after_output
        self.session = FakeSession()
        self.server = FakeServer(self._handle)
        self.died = False

    @property
    def url(self) -> str:
        return self.server.url

    async def _handle(self, ws, request):
        session = self.session
        session.ws = ws
        await session.until("session.update")
        await session.send(session_created(caps={**RESUMABLE, "supports_session_resume": False}))
        if self.announce:
            for message in function_call_messages("resp_c1", "item_c1", "call_1"):
                await session.send(message)
        while (data := await session.receive(timeout=30)) is not None:
            if data["type"] == "conversation.item.create":  # echoed as vLLM-Omni does
                item = {**data["item"], "status": "completed"}
                await session.send({"type": "conversation.item.added", "item": item})
                await session.send({"type": "conversation.item.done", "item": item})
                if self.dies_after_output and item.get("type") == "function_call_output":
                    self.died = True
                    drop_connection(ws, request)
                    return

    def kill(self) -> None:
        assert self.session.ws is not None
        self.died = True
        asyncio.get_running_loop().create_task(self.session.ws.close())


class Hosts:
    """A ``Placement`` over hosts: each move takes the next one."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts
        self.backends: list[RemoteBackend] = []

    async def place(self):
        host = next(h for h in self.hosts if not h.died and all(b.url.human_repr() != h.url for b in self.backends))
        backend = RemoteBackend(host.url, options=RemoteOptions())
        self.backends.append(backend)
        return SimpleNamespace(url=host.url), await backend.open()

    def lost(self, member, reason=None) -> None:
        pass


@pytest.fixture
async def moving():
    """moving(first, second) -> a FailoverConversation on ``first`` that moves to ``second``."""
    made: list[Hosts] = []

    async def start(*hosts: Host) -> FailoverConversation:
        for host in hosts:
            await host.server.start()
        placement = Hosts(list(hosts))
        made.append(placement)
        member, conversation = await placement.place()
        return FailoverConversation(placement, member, conversation, lost_grace_s=5.0)

    yield start
    for placement in made:
        for backend in placement.backends:
            await backend.close()
        for host in placement.hosts:
            await host.server.close()


@pytest.mark.parametrize("output_before_the_move", [True, False])
async def test_a_call_in_flight_moves_to_the_next_host_once(moving, output_before_the_move):
    old = Host(announce=True, dies_after_output=output_before_the_move)
    new = Host(announce=False, dies_after_output=False)
    call = await moving(old, new)
    seen: list[p.ServerEvent] = []
    call.send(p.SessionUpdate({"tools": [WEATHER]}))
    await events_until(call, lambda e: isinstance(e, p.ResponseFunctionCallArgumentsDone), seen)
    output = p.ConversationItemCreate({"type": "function_call_output", "call_id": "call_1", "output": "sunny"})
    if output_before_the_move:
        call.send(output)
        call.send(p.ResponseCreate())  # never answered: the host died with the output
    else:
        old.kill()
    await until(lambda: call.moves == 1, 10.0, "the move")
    if not output_before_the_move:
        call.send(output)
        call.send(p.ResponseCreate())
    await until(lambda: len(new.session.received_of("response.create")) == 1, 10.0, "the response.create")
    # The new host knows the call before its output, and gets each once.
    items = [m["item"] for m in new.session.received_of("conversation.item.create")]
    assert [(i["type"], i["call_id"]) for i in items] == [("function_call", "call_1"),
                                                          ("function_call_output", "call_1")]
    assert items[0]["name"] == "get_weather" and items[0]["arguments"] == '{"city":"Paris"}'
    assert items[1]["output"] == "sunny"
    assert new.session.received_of("session.update")[-1]["session"]["tools"] == [WEATHER]
    call.send(p.ConversationItemRetrieve(item_id="nope", event_id="evt_after"))
    await events_until(call, lambda e: isinstance(e, p.ErrorEvent) and e.code == "item_not_found", seen)
    # The transport saw the call once, and no second echo of anything: the new host's of what was
    # restated stay with the move.
    assert len([e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]) == 1
    for kind in (p.ConversationItemAdded, p.ConversationItemDone):
        echoed = [e.item["call_id"] for e in seen if isinstance(e, kind)]
        assert sorted(echoed) == ["call_1", "call_1"]  # the call's, and its output's once
    assert [e.code for e in seen if isinstance(e, p.ErrorEvent)] == ["item_not_found"]
    await call.close()


async def test_our_own_server_through_the_remote_backend(our_endpoint):
    """Our endpoint with the scripted model (its runner's tools): the call, the output, the answer."""
    script = Script(reply="let me check", calls=[{"name": "get_weather", "arguments": '{"city": "Paris"}'}],
                    tool_reply="it is {output}")
    backend = RemoteBackend(await our_endpoint(script))
    conversation = await backend.open()
    try:
        assert conversation.capabilities.supports_tools and not conversation.capabilities.replies_to_tool_output
        seen: list[p.ServerEvent] = []
        conversation.send(p.SessionUpdate({"turn_detection": None, "tools": [WEATHER]}))
        conversation.send(p.InputAudioBufferAppend(tone(300)))
        conversation.send(p.InputAudioBufferCommit())
        call = await events_until(conversation, lambda e: isinstance(e, p.ResponseFunctionCallArgumentsDone), seen)
        assert isinstance(call, p.ResponseFunctionCallArgumentsDone) and call.arguments == '{"city": "Paris"}'
        await events_until(conversation, lambda e: isinstance(e, p.ResponseDone) and e.function_call is None, seen)
        mine = [e for e in seen if getattr(e, "response_id", None) == call.response_id]
        assert [type(e) for e in mine] == [t for t in CALL_ORDER if t not in (p.ConversationItemAdded,
                                                                              p.ConversationItemDone)]
        assert isinstance(mine[0], p.ResponseCreated) and mine[0].function_call is not None
        conversation.send(p.ConversationItemCreate({"type": "function_call_output", "call_id": call.call_id,
                                                    "output": "sunny"}))
        conversation.send(p.ResponseCreate())
        answer = await events_until(conversation, lambda e: isinstance(e, p.ResponseTranscriptDone), seen)
        assert isinstance(answer, p.ResponseTranscriptDone) and answer.transcript.split()[-3:] == ["it", "is", "sunny"]
        assert not [e for e in seen if isinstance(e, p.ErrorEvent)]
        assert len([e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]) == 1
    finally:
        await conversation.close()
        await backend.close()


@pytest.fixture
async def our_endpoint():
    """our_endpoint(script) -> the realtime URL of our own app serving the scripted model."""
    cleanups: list = []

    async def start(script: Script) -> str:
        plugin = ScriptedPlugin(as_float32_audio, script)
        local = LocalBackend(plugin, plugin.build_local_engine())
        server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
        await server.start_server()
        cleanups.extend([local.close, server.close])
        return str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


def test_the_operator_says_whether_the_backends_call_tools():
    told = build_backend(Settings(backend="ws://127.0.0.1:9/v1/realtime?duplex=1", backend_tools="yes",
                                  backend_replies_to_tool_output="no"))
    assert isinstance(told, RemoteBackend)
    assert (told.options.tools, told.options.replies_to_tool_output) == (True, False)
    unsaid = build_backend(Settings(backend="ws://127.0.0.1:9/v1/realtime?duplex=1"))
    assert isinstance(unsaid, RemoteBackend) and unsaid.options.tools is None
    with pytest.raises(ModelStartError, match="--backend-tools"):
        build_backend(Settings(backend="ws://127.0.0.1:9/v1/realtime?duplex=1", backend_tools="maybe"))


async def test_the_edge_runs_a_tool_once_through_the_remote_backend_and_the_answer_carries_it(our_endpoint):
    """A call's whole tool loop over the remote backend to our endpoint: the caller speaks, the model
    calls, the call path's edge runner runs the tool and answers, the model speaks the result."""
    runs = toolkit.reset()
    script = Script(reply="let me see", calls=[{"name": "get_weather", "arguments": '{"city": "Paris"}'}],
                    tool_reply="{output}")
    backend = RemoteBackend(await our_endpoint(script))
    conversation = await backend.open()
    box = ToolBox(load_tool_module("tests.tools.toolkit"), EdgeToolOptions(hold_after_s=5.0))
    seen: list[p.ServerEvent] = []
    path = CallAudioPath(conversation, vad_model=EnergyVadModel(), on_event=seen.append,
                         tools=box.for_call(CallInfo("peer", "alice", FakeControl())))
    await path.start()
    question = speak("What is the weather in Paris?", SAMPLE_RATE, before_ms=200, after_ms=1500)
    quiet = np.zeros(FRAME_SAMPLES, np.float32)
    try:
        for start in range(0, len(question) - FRAME_SAMPLES, FRAME_SAMPLES):  # faster than real time
            path.push_caller_frame(question[start:start + FRAME_SAMPLES], SAMPLE_RATE)
            path.next_frame()
            await asyncio.sleep(0.002)

        def answered() -> bool:
            path.push_caller_frame(quiet, SAMPLE_RATE)
            path.next_frame()
            return any(isinstance(e, p.ResponseTranscriptDone) and "Sunny" in e.transcript for e in seen)

        await until(answered, 20.0, "the answer with the tool's result")
        assert runs.calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
        assert len([e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]) == 1
        assert not [e for e in seen if isinstance(e, p.ErrorEvent)]
    finally:
        await path.close()
        await conversation.close()
        await backend.close()
