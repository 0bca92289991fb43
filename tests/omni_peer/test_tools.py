"""Tools through the real vLLM-Omni 0.30.0: our remote backend against its serving path.

The peer runs with ``--tools``: its scripted model calls the session's tool through vLLM-Omni's
own ``function_call.done`` path (``devtools/omni_peer/tool_seams.py``, ``scripted_calls.py``).
Its plugin (Qwen3-Omni's) is turn-based, so vLLM-Omni does not answer an output by itself and
refuses the ``response.create`` after it: the answer comes on the caller's next turn. That is
why our backend reports no tools for such a server, and these tests say ``tools=True``.
"""

from __future__ import annotations

import json

import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from tests.omni_peer.caller import REPLY_TIMEOUT_S
from tests.remote.conversation_events import events_until
from tests.support.audio import tone
from tests.support.waits import until
from tests.tcp_relay import TcpRelay

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "examples": ["Paris"]}},
                          "required": ["city"]}}
CALL_ORDER = [p.ResponseCreated, p.ConversationItemAdded, p.ResponseOutputItemAdded,
              p.ResponseFunctionCallArgumentsDelta, p.ResponseFunctionCallArgumentsDone, p.ResponseOutputItemDone,
              p.ConversationItemDone, p.ResponseDone]


@pytest.fixture(scope="module")
def peer(omni_peers):
    return omni_peers(tools=True)


@pytest.fixture
async def remote(peer):
    """remote(port=None, **options) -> a conversation on the peer (through ``port``, a relay, when given)."""
    made: list[RemoteBackend] = []

    async def open_conversation(port: int | None = None, **options):
        url = peer.realtime_url if port is None else f"ws://127.0.0.1:{port}/v1/realtime?duplex=1"
        backend = RemoteBackend(url, options=RemoteOptions(**{"tools": True, "resume_backoff_s": 0.05, **options}))
        made.append(backend)
        conversation = await backend.open()
        conversation.send(p.SessionUpdate({"turn_detection": None, "tools": [WEATHER]}))
        return conversation

    yield open_conversation
    for backend in made:
        await backend.close()


def ask(conversation) -> None:
    conversation.send(p.InputAudioBufferAppend(tone(600)))
    conversation.send(p.InputAudioBufferCommit())


async def until_event(conversation, seen: list[p.ServerEvent], kind: type, **fields) -> p.ServerEvent:
    def matches(event: p.ServerEvent) -> bool:
        return isinstance(event, kind) and all(getattr(event, k) == v for k, v in fields.items())
    return await events_until(conversation, matches, seen, REPLY_TIMEOUT_S)


async def the_call(conversation, seen: list[p.ServerEvent]) -> p.ResponseFunctionCallArgumentsDone:
    """The call of the turn just asked, once its response and the spoken reply beside it are done."""
    call = await until_event(conversation, seen, p.ResponseFunctionCallArgumentsDone)
    assert isinstance(call, p.ResponseFunctionCallArgumentsDone)
    await until_event(conversation, seen, p.ResponseDone, response_id=call.response_id)
    spoken = next(e for e in seen if isinstance(e, p.ResponseCreated) and e.response_id != call.response_id)
    if not any(isinstance(e, p.ResponseDone) and e.response_id == spoken.response_id for e in seen):
        await until_event(conversation, seen, p.ResponseDone, response_id=spoken.response_id)
    return call


def acknowledge_spoken(conversation, seen: list[p.ServerEvent], call: p.ResponseFunctionCallArgumentsDone) -> None:
    """The spoken reply beside the call, acknowledged as played out whole (a transport's own ack)."""
    spoken = next(e for e in seen if isinstance(e, p.ResponseCreated) and e.response_id != call.response_id)
    audio_ms = sum(e.audio_ms for e in seen if isinstance(e, p.ResponseAudioDelta)
                   and e.response_id == spoken.response_id)
    conversation.send(p.PlaybackAck(response_id=spoken.response_id, played_ms=audio_ms))


def output(call_id: str, value: object, event_id: str) -> p.ConversationItemCreate:
    return p.ConversationItemCreate({"type": "function_call_output", "call_id": call_id, "output": value},
                                    event_id=event_id)


async def test_a_call_arrives_in_order_and_its_output_is_answered(peer, remote):
    plain = await RemoteBackend(peer.realtime_url).open()
    assert not plain.capabilities.supports_tools  # a turn-based vLLM-Omni plugin: the tool loop cannot close
    await plain.close()
    conversation = await remote()
    seen: list[p.ServerEvent] = []
    ask(conversation)
    call = await the_call(conversation, seen)
    assert json.loads(call.arguments) == {"city": "Paris"}
    mine = [e for e in seen if getattr(e, "response_id", None) == call.response_id
            or isinstance(e, p.ConversationItemAdded | p.ConversationItemDone) and e.item.get("id") == call.item_id]
    assert [type(e) for e in mine] == CALL_ORDER
    assert mine[0] == p.ResponseCreated(call.response_id, call.item_id, function_call=mine[1].item)
    assert isinstance(mine[-1], p.ResponseDone) and mine[-1].function_call == mine[1].item
    spoken = [e for e in seen if isinstance(e, p.ResponseTranscriptDone)]
    assert [e.transcript for e in spoken] == ["reply 1 checking"]

    acknowledge_spoken(conversation, seen, call)  # the caller heard "checking" while the tool ran
    conversation.send(output(call.call_id, "sunny and mild", "evt_output"))
    echo = await until_event(conversation, seen, p.ConversationItemAdded)
    assert isinstance(echo, p.ConversationItemAdded)
    assert (echo.item["type"], echo.item["call_id"], echo.item["output"]) == ("function_call_output", call.call_id,
                                                                             "sunny and mild")
    # vLLM-Omni's turn-based path: no answer by itself, and a response.create has no new input to answer.
    conversation.send(p.ResponseCreate(event_id="evt_more"))
    refused = await until_event(conversation, seen, p.ErrorEvent)
    assert isinstance(refused, p.ErrorEvent)
    assert refused.code == "response_create_without_input"  # (vLLM-Omni names no event in this one)
    # The caller's next turn hears the tool's result.
    ask(conversation)
    answer = await until_event(conversation, seen, p.ResponseTranscriptDone)
    assert isinstance(answer, p.ResponseTranscriptDone) and answer.transcript == "reply 2 sunny and mild"
    assert len([e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]) == 1
    await conversation.close()


async def test_each_refused_output_comes_back_as_vllm_omnis_error(remote):
    conversation = await remote()
    seen: list[p.ServerEvent] = []
    ask(conversation)
    call = await the_call(conversation, seen)
    conversation.send(output(call.call_id, "sunny", "evt_first"))
    conversation.send(output("call_nobody_made", "rain", "evt_unknown"))
    conversation.send(output(call.call_id, {"sky": "clear"}, "evt_not_a_string"))
    conversation.send(output(call.call_id, "sunny again", "evt_second"))
    for _ in range(3):
        await until_event(conversation, seen, p.ErrorEvent)
    errors = {e.error["event_id"]: e.error for e in seen if isinstance(e, p.ErrorEvent)}
    assert set(errors) == {"evt_unknown", "evt_not_a_string", "evt_second"}
    assert {e["code"] for e in errors.values()} == {"invalid_function_call_output"}
    assert errors["evt_unknown"]["param"] == "item.call_id"
    assert errors["evt_not_a_string"]["message"] == "function_call_output requires a string output"
    assert "already exists" in errors["evt_second"]["message"]
    await conversation.close()


async def test_a_resume_while_the_tool_runs_repeats_nothing(peer, remote):
    relay = await TcpRelay(peer.port).start()
    try:
        conversation = await remote(relay.port)
        seen: list[p.ServerEvent] = []
        ask(conversation)
        call = await until_event(conversation, seen, p.ResponseFunctionCallArgumentsDone)
        assert isinstance(call, p.ResponseFunctionCallArgumentsDone)
        # The link drops while the edge runs the tool (the reply beside the call still streaming);
        # the output is written meanwhile and goes after the resume.
        assert relay.cut() == 1
        conversation.send(output(call.call_id, "sunny and mild", "evt_output"))
        echo = await until_event(conversation, seen, p.ConversationItemAdded)
        assert isinstance(echo, p.ConversationItemAdded) and echo.item["call_id"] == call.call_id
        await until(lambda: conversation.resumes == 1, REPLY_TIMEOUT_S, "the resume")
        conversation.send(p.ConversationItemRetrieve(item_id="item_nope", event_id="evt_fence"))
        await until_event(conversation, seen, p.ErrorEvent)
        assert [e.code for e in seen if isinstance(e, p.ErrorEvent)] == ["item_not_found"]
        assert [e.call_id for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)] == [call.call_id]
        outputs = [e for e in seen if isinstance(e, p.ConversationItemAdded) and e.item["type"] == "function_call_output"]
        assert len(outputs) == 1
        calls = [line for line in peer.record() if line.get("calls")]
        assert len([c for line in calls for c in line["calls"] if c["call_id"] == call.call_id]) == 1
        await conversation.close()
    finally:
        await relay.stop()


async def test_a_reply_with_more_calls_than_the_bound_is_bounded(remote):
    conversation = await remote()
    # The scripted model makes this many calls in its reply (vLLM-Omni: one function_call.done each).
    conversation.send(p.SessionUpdate({"metadata": {"scripted_calls_per_reply": MAX_CALLS_PER_REPLY + 2}}))
    seen: list[p.ServerEvent] = []
    ask(conversation)
    spoken = await until_event(conversation, seen, p.ResponseCreated, function_call=None)
    await until_event(conversation, seen, p.ResponseDone, response_id=spoken.response_id)
    conversation.send(p.ConversationItemRetrieve(item_id="item_nope", event_id="evt_fence"))
    await until_event(conversation, seen, p.ErrorEvent)
    calls = [e for e in seen if isinstance(e, p.ResponseFunctionCallArgumentsDone)]
    assert len(calls) == MAX_CALLS_PER_REPLY
    assert [e.code for e in seen if isinstance(e, p.ErrorEvent)] == ["item_not_found"]
    assert not [e for e in seen if isinstance(e, p.ConversationItemAdded) and e.item["type"] == "function_call_output"]
    # vLLM-Omni took the error outputs for the two refused calls: the next reply speaks them.
    ask(conversation)
    answer = await until_event(conversation, seen, p.ResponseTranscriptDone)
    assert isinstance(answer, p.ResponseTranscriptDone)
    # (The peer's reply count is not asserted: a fresh-clone run numbered this answer 1, not 2.)
    assert answer.transcript.count("too_many_function_calls") == 2, answer.transcript
    await conversation.close()
