"""Acks this side sends for its transport, and the ``output_audio_buffer.clear`` after a partial one.

vLLM-Omni 0.30.0 keeps a finished reply's turn busy while the acknowledged playback is short of the
audio it sent (agent/remote/self_acks.py explains the rule and where it comes from); these tests
check, on a recording server, what goes out and in what order.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.answers import ExpectedAnswers
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.responses import ServerResponses
from duplex_agent.agent.remote.self_acks import SELF_ACK_MARGIN_S, SelfAcks
from duplex_agent.agent.remote.session import parse_session_created

from .fake_server import OMNI_CAPS, FakeServer, FakeSession, audio_delta, response_done, session_created

CAPS = {**OMNI_CAPS, "supports_audio_truncate": True}
#: A reply far longer than any stall between its arrival and the next turn: it cannot have played out.
LONG_REPLY_MS = 5000


@pytest.fixture
async def opened():
    """A conversation on a vLLM-Omni-shaped server that records what it gets: (conversation, session)."""
    closing: list = []

    async def open_one():
        sessions: list[FakeSession] = []

        async def handler(ws, request):
            session = FakeSession()
            session.ws = ws
            sessions.append(session)
            await session.until("session.update")
            await ws.send_str(json.dumps(session.stamp(session_created(caps=CAPS))))
            while await session.receive(timeout=30) is not None:
                pass

        server = await FakeServer(handler).start()
        backend = RemoteBackend(server.url, model="m")
        closing.append((server, backend))
        conversation = await backend.open()
        return conversation, sessions[-1]

    yield open_one
    for server, backend in closing:
        await backend.close()
        await server.close()


async def _reply(session: FakeSession, events, response_id: str, *, deltas: int, ms: float = 1000.0) -> None:
    """The server sends a whole reply at once; returns when the transport has its ``response.done``."""
    await session.send({"type": "response.created", "response_id": response_id, "response": {"id": response_id}})
    for _ in range(deltas):
        await session.send(audio_delta(response_id, ms))
    await session.send(response_done(response_id))
    while not isinstance(await anext(events), p.ResponseDone):
        pass


async def _received_until(session: FakeSession, kind: str, timeout: float = 10.0) -> list[dict]:
    """What the server got after the opening update, once a message of ``kind`` is among it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not session.received_of(kind):
        assert loop.time() < deadline, f"no {kind}: {[m['type'] for m in session.received]}"
        await asyncio.sleep(0.01)
    return session.received[1:]


def _types(messages: list[dict]) -> list[str]:
    return [m["type"] for m in messages if m["type"] != "input_audio_buffer.append"]


def _speech(ms: int) -> np.ndarray:
    return (0.2 * np.sin(np.arange(16 * ms) / 3)).astype(np.float32)


async def test_a_commit_before_the_reply_could_have_played_acks_what_was_heard_then_clears(opened):
    conversation, session = await opened()
    conversation.send(p.SessionUpdate({"input_sample_rate": 16000}))
    events = conversation.events()
    await _reply(session, events, "r1", deltas=LONG_REPLY_MS // 1000)
    conversation.send(p.InputAudioBufferAppend(_speech(300)))
    conversation.send(p.InputAudioBufferCommit())
    received = await _received_until(session, "input_audio_buffer.commit")
    # The appends went out first; the partial ack, then the clear that frees vLLM-Omni's turn, go
    # right before the commit they are for.
    assert _types(received) == ["session.update", "playback.ack", "output_audio_buffer.clear",
                                "input_audio_buffer.commit"]
    assert received[-4]["type"] == "input_audio_buffer.append"
    ack = session.received_of("playback.ack")[0]
    assert ack["response_id"] == "r1" and ack["item_id"] == "item_r1" and ack["truncate"] is True
    assert 0 <= ack["played_ms"] == ack["committed_ms"] < LONG_REPLY_MS
    # The server's answer to that clear is not the transport's: its playout is left alone.
    await session.send({"type": "output_audio_buffer.cleared", "response_id": "r1"})
    await session.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0.0, "item_id": "u2"})
    assert (await anext(events)).type == "input_audio_buffer.speech_started"
    await conversation.close()


async def test_a_reply_that_has_played_out_is_acknowledged_whole_and_nothing_is_cleared(opened):
    conversation, session = await opened()
    conversation.send(p.SessionUpdate({"input_sample_rate": 16000}))
    events = conversation.events()
    await _reply(session, events, "r1", deltas=1, ms=100.0)
    await _received_until(session, "playback.ack")  # this side's ack once its 100 ms have played
    conversation.send(p.InputAudioBufferAppend(_speech(300)))
    conversation.send(p.InputAudioBufferCommit())
    received = await _received_until(session, "input_audio_buffer.commit")
    assert _types(received) == ["session.update", "playback.ack", "input_audio_buffer.commit"]
    ack = session.received_of("playback.ack")[0]
    assert ack["played_ms"] == ack["committed_ms"] == 100 and "truncate" not in ack
    await conversation.close()


async def test_the_transports_own_acks_go_out_alone(opened):
    conversation, session = await opened()
    events = conversation.events()
    await _reply(session, events, "r1", deltas=2)
    await _reply(session, events, "r2", deltas=2)
    conversation.send(p.PlaybackAck(response_id="r1", played_ms=700, truncate=True))
    conversation.send(p.PlaybackAck(response_id="r2", played_ms=1200, truncate=True))
    conversation.send(p.InputAudioBufferCommit())  # a marker: everything before it has gone out
    received = await _received_until(session, "input_audio_buffer.commit")
    assert _types(received) == ["playback.ack", "playback.ack", "input_audio_buffer.commit"]
    await conversation.close()


# ---- the policy alone, without a socket ----


def _policy() -> tuple[SelfAcks, ServerResponses, ExpectedAnswers, list[dict]]:
    remote = parse_session_created(session_created(caps=CAPS), model="m", max_sessions=1)
    responses, answers, queued = ServerResponses(), ExpectedAnswers(), []
    return SelfAcks(remote, responses, answers, queued.extend), responses, answers, queued


def _heard(acks: SelfAcks, responses: ServerResponses, response_id: str, ms: float) -> None:
    responses.created(p.ResponseCreated(response_id, f"item_{response_id}"))
    acks.heard(p.ResponseAudioDelta(response_id, f"item_{response_id}", np.zeros(0, np.float32), 24000, 0.0, ms))


async def test_a_finished_reply_not_yet_heard_is_owed_a_partial_ack_and_a_clear_whose_answers_stay_here():
    acks, responses, answers, queued = _policy()
    _heard(acks, responses, "r1", LONG_REPLY_MS)
    assert acks.owed() == []  # still arriving: nothing is owed yet
    acks.ended("r1")
    ack, clear = acks.owed()
    assert ack["type"] == "playback.ack" and ack["truncate"] is True and ack["item_id"] == "item_r1"
    assert 0 <= ack["played_ms"] == ack["committed_ms"] < LONG_REPLY_MS
    assert clear == {"type": "output_audio_buffer.clear", "event_id": "evt_self_ack_2"}
    assert acks.is_own_clear(p.OutputAudioBufferCleared("r1")) and acks.owed() == []
    refusal = {"type": "error", "error": {"code": "response_not_active", "event_id": ack["event_id"]}}
    assert answers.take(refusal) and answers.take({**refusal, "error": {"event_id": "evt_self_ack_2"}})
    assert queued == []


async def test_a_cut_or_older_reply_gets_no_clear_and_a_transports_ack_cancels_ours():
    acks, responses, _, queued = _policy()
    _heard(acks, responses, "r1", LONG_REPLY_MS)
    _heard(acks, responses, "r2", LONG_REPLY_MS)
    responses.cut.add("r2")
    _heard(acks, responses, "r3", LONG_REPLY_MS)
    for response_id in ("r1", "r2", "r3"):
        acks.ended(response_id)
    acks.acked_by_transport("r3")
    assert [(m["type"], m.get("response_id")) for m in acks.owed()] == [("playback.ack", "r1"), ("playback.ack", "r2")]
    await asyncio.sleep(SELF_ACK_MARGIN_S + 0.2)
    assert queued == []  # nothing is left to ack when the timers fire


async def test_a_reply_that_played_out_is_acked_whole_by_its_timer_and_nothing_after_stop():
    acks, responses, _, queued = _policy()
    _heard(acks, responses, "r1", 50.0)
    acks.ended("r1")
    _heard(acks, responses, "r2", 50.0)
    acks.ended("r2")
    acks.stop()
    await asyncio.sleep(SELF_ACK_MARGIN_S + 0.3)
    assert queued == []
    acks, responses, _, queued = _policy()
    _heard(acks, responses, "r1", 50.0)
    acks.ended("r1")
    await asyncio.sleep(SELF_ACK_MARGIN_S + 0.3)
    assert queued == [{"type": "playback.ack", "response_id": "r1", "played_ms": 50, "committed_ms": 50,
                       "event_id": "evt_self_ack_1", "item_id": "item_r1"}]
