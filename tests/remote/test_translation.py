"""Capabilities and client events translated for the server; server shapes translated back."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import fields, replace

import numpy as np
import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.events import ServerMessageReader
from duplex_agent.agent.remote.input import Outgoing, OutgoingQueue
from duplex_agent.agent.remote.session import parse_session_created, translate_session_update
from duplex_agent.plugins.contract import DuplexCapabilities

from .fake_server import OMNI_CAPS, FakeServer, FakeSession, audio_delta, response_done, session_created

OURS_CAPS = {"plugin_id": "reference", "input_sample_rate": 16000, "unit_samples": 1600, "output_sample_rate": 22050,
             "max_sessions": 4, "input_mode": "turn", "input_formats": ["pcm16", "pcm_f32le"], "output_format": "pcm16",
             "supports_barge_in": True, "supports_playback_ack": True, "supports_truncation": True,
             "supports_resume": False, "handles_overlap": False, "unit_ms": 100.0}


def test_capabilities_of_both_dialects():
    ours = parse_session_created({"type": "session.created", "session": {
        "id": "sess_1", "input_audio_format": "pcm16", "input_sample_rate": 16000, "capabilities": OURS_CAPS}},
        model="", max_sessions=3)
    assert (ours.session_id, ours.input_rate, ours.extended) == ("sess_1", 16000, False)
    assert ours.capabilities.unit_samples == 1600 and ours.capabilities.output_sample_rate == 22050
    assert ours.capabilities.max_sessions == 3 and not ours.capabilities.supports_resume

    omni = parse_session_created(session_created(caps={**OMNI_CAPS, "supports_barge_in": False}),
                                 model="openbmb/MiniCPM-o-4_5", max_sessions=2)
    caps = omni.capabilities
    assert omni.extended and omni.resume_token == "tok-1" and omni.session_id == "duplex-1"
    assert (caps.input_sample_rate, caps.unit_samples, caps.output_sample_rate) == (16000, 16000, 24000)
    assert caps.supports_resume and caps.supports_playback_ack and not caps.supports_barge_in
    assert caps.input_mode == "continuous"


def test_every_capability_of_our_server_reaches_the_client_across_the_hop():
    # Each flag set the other way from its default, so a field the client forgets to read fails here.
    served = DuplexCapabilities(
        plugin_id="reference", input_sample_rate=16000, unit_samples=1600, output_sample_rate=22050, max_sessions=4,
        input_formats=("pcm16",), **{f.name: not f.default for f in fields(DuplexCapabilities) if f.type == "bool"})
    remote = parse_session_created({"type": "session.created", "session": {
        "id": "s", "input_audio_format": "pcm16", "capabilities": served.to_dict()}}, model="", max_sessions=2)
    assert remote.capabilities == replace(served, max_sessions=2)

    omni = parse_session_created(session_created(caps=OMNI_CAPS), model="", max_sessions=1).capabilities
    assert not omni.speaks_given_text and not omni.random_weights


def test_session_update_keeps_local_audio_fields_and_speaks_the_servers_policy_names():
    omni = parse_session_created(session_created(caps={**OMNI_CAPS, "supports_barge_in": False}), model="",
                                 max_sessions=1)
    update = {"input_audio_format": "pcm_f32le", "input_sample_rate": 48000, "overlap_policy": "barge_in",
              "turn_detection": {"type": "server_vad"}, "instructions": "be brief"}
    assert translate_session_update(update, omni) == {"overlap_policy": "listen_only", "turn_detection": None,
                                                      "instructions": "be brief"}
    ours = parse_session_created({"session": {"id": "s", "capabilities": OURS_CAPS}}, model="", max_sessions=1)
    assert translate_session_update(update, ours) == {
        "overlap_policy": "barge_in", "turn_detection": {"type": "server_vad"}, "instructions": "be brief"}


def test_vllm_omni_event_shapes_become_ours():
    reader = ServerMessageReader(24000)
    # vLLM-Omni's response.created names no item: it waits for the next message (a call's names one).
    assert reader.read({"type": "response.created", "response_id": "r1", "response": {"id": "r1"}}) == []
    # metadata.audio_duration_ms is the response's total so far; each chunk's length is its own.
    created, first = reader.read({**audio_delta("r1", 100), "metadata": {"audio_duration_ms": 100}})
    assert created == p.ResponseCreated("r1", "item_r1")
    [second] = reader.read({**audio_delta("r1", 60), "type": "response.audio.delta",  # beta spelling
                            "metadata": {"audio_duration_ms": 160}})
    assert isinstance(first, p.ResponseAudioDelta) and isinstance(second, p.ResponseAudioDelta)
    assert (first.sample_rate, first.audio_start_ms, first.audio_ms) == (24000, 0.0, 100.0)
    assert (second.audio_start_ms, second.audio_ms) == (100.0, 60.0)
    [done] = reader.read(response_done("r1", "cancelled", "barge_in"))
    assert done == p.ResponseDone("r1", "cancelled", "barge_in")
    [flat] = reader.read({"type": "error", "error": "Unknown or expired session", "code": "session_resume_expired"})
    assert isinstance(flat, p.ErrorEvent) and flat.code == "session_resume_expired"
    assert reader.read({"type": "rate_limits.updated", "rate_limits": []}) == []
    assert reader.read({"type": "no.such.event"}) == []
    assert reader.read({"type": "response.output_audio.delta", "response_id": 7}) == []
    [stopped] = reader.read({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": None})
    assert stopped == p.SpeechStopped(900.0, None)


def test_pcm_f32le_deltas_and_text_marks_with_their_words():
    reader = ServerMessageReader(24000)
    samples = np.full(2400, 0.25, dtype="<f4")  # 100 ms at 24 kHz
    delta = {"type": "response.output_audio.delta", "response_id": "r1", "item_id": "item_r1",
             "delta": base64.b64encode(samples.tobytes()).decode(), "format": "pcm_f32le", "sample_rate_hz": 24000,
             "metadata": {"audio_duration_ms": 100, "audio_text_marks": [{"text_chars": 5, "audio_end_ms": 60},
                                                                        {"text_chars": 11, "audio_end_ms": 100}]}}
    assert reader.read(delta) == []  # its words are in the transcript delta that follows
    transcript = {"type": "response.output_audio_transcript.delta", "response_id": "r1", "item_id": "item_r1",
                  "delta": "Hello there"}
    audio, text = reader.read(transcript)
    assert isinstance(audio, p.ResponseAudioDelta) and isinstance(text, p.ResponseTranscriptDelta)
    assert audio.audio_ms == 100.0 and np.allclose(audio.audio, 0.25)
    assert audio.marks == [{"text": "Hello", "start_ms": 0.0, "end_ms": 60.0},
                           {"text": "there", "start_ms": 60.0, "end_ms": 100.0}]


async def test_outgoing_queue_drops_oldest_audio_beyond_its_bound():
    queue = OutgoingQueue(max_audio_ms=300)
    assert not queue.put(Outgoing("commit-0"))
    started = [queue.put(Outgoing(f"audio-{i}", 100)) for i in range(6)]
    assert started == [False, False, False, True, False, False]  # one report per overflow
    assert queue.audio_ms == 300 and queue.dropped_ms == 300 and len(queue) == 4

    assert [(await queue.get()).text for _ in range(4)] == ["commit-0", "audio-3", "audio-4", "audio-5"]


@pytest.fixture
async def recording():
    """A vLLM-Omni-shaped server that records what the client sends; returns (backend, session, open)."""
    made: list[tuple[FakeServer, RemoteBackend]] = []
    sessions: list[FakeSession] = []

    async def open_with(caps: dict):
        async def handler(ws, request):
            session = FakeSession()
            session.ws = ws
            sessions.append(session)
            await session.until("session.update")
            await ws.send_str(json.dumps(session.stamp(session_created(caps=caps))))
            while await session.receive(timeout=30) is not None:
                pass

        server = await FakeServer(handler).start()
        backend = RemoteBackend(server.url, model="m", api_key="secret")
        made.append((server, backend))
        conversation = await backend.open()
        return server, conversation, sessions[-1]

    yield open_with
    for server, backend in made:
        await backend.close()
        await server.close()


async def settle(session: FakeSession, count: int, timeout: float = 10.0) -> None:
    """Until the fake server has received ``count`` messages (a poll of its record)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(session.received) < count:
        assert loop.time() < deadline, f"the server got {len(session.received)} of {count} messages"
        await asyncio.sleep(0.01)


async def test_the_client_opens_with_model_and_key_and_reencodes_audio_in_whole_units(recording):
    server, conversation, session = await recording(OMNI_CAPS)
    assert server.requests[0].headers["Authorization"] == "Bearer secret"
    assert session.received[0]["session"]["model"] == "m"
    conversation.send(p.SessionUpdate({"input_audio_format": "pcm_f32le", "input_sample_rate": 48000,
                                       "overlap_policy": "barge_in"}))
    frame = (0.2 * np.sin(np.arange(480) / 3)).astype("<f4")  # 10 ms at 48 kHz
    for _ in range(35):
        conversation.send(p.InputAudioBufferAppend(frame))
    conversation.send(p.InputAudioBufferCommit())
    await settle(session, 7)  # the opening update, the update, four appends, the commit
    update, *appends, commit = session.received[1:]
    # vLLM-Omni refuses barge_in_on_speech without server VAD: the pair goes together.
    assert update == {"type": "session.update", "session": {"overlap_policy": "barge_in_on_speech",
                                                            "turn_detection": {"type": "server_vad"}}}
    # vLLM-Omni's commit defaults response_create to false: the client asks for the reply it expects.
    assert commit == {"type": "input_audio_buffer.commit", "response_create": True}
    sizes = [len(base64.b64decode(a["audio"])) // 2 for a in appends]  # pcm16 at 16 kHz
    assert sizes[:3] == [1600, 1600, 1600]  # 100 ms slices of MiniCPM-o's 1 s unit
    # The remainder goes with the commit (less the ~15 ms the resampler holds back).
    assert 0 < sizes[3] < 1600 and 5600 - 320 < sum(sizes) <= 5600


async def test_barge_in_becomes_the_servers_barge_in_and_a_truncating_ack(recording):
    _, conversation, session = await recording(OMNI_CAPS)
    await session.send({"type": "response.created", "response_id": "r1", "response": {"id": "r1"}})
    await session.send(audio_delta("r1"))
    events = conversation.events()
    assert (await anext(events)).type == "response.created"
    assert (await anext(events)).type == "response.output_audio.delta"
    conversation.send(p.ResponseCancel(response_id="r1", reason="barge_in"))
    conversation.send(p.PlaybackAck(response_id="r1", played_ms=80))
    await settle(session, 3)
    assert session.received[1:] == [{"type": "barge_in"}, {
        "type": "playback.ack", "response_id": "r1", "played_ms": 80, "committed_ms": 80, "item_id": "item_r1"}]
    # supports_audio_truncate is not advertised here: no truncate flag.


async def test_a_model_that_cannot_be_interrupted_gets_only_the_ack_and_its_response_ends_here(recording):
    _, conversation, session = await recording({**OMNI_CAPS, "supports_barge_in": False})
    await session.send({"type": "response.created", "response_id": "r1"})
    await session.send(audio_delta("r1"))
    events = conversation.events()
    await anext(events)
    await anext(events)
    conversation.send(p.ResponseCancel(response_id="r1", reason="barge_in"))
    conversation.send(p.PlaybackAck(response_id="r1", played_ms=40))
    assert await anext(events) == p.ResponseDone("r1", "cancelled", "barge_in")
    await session.send(audio_delta("r1"))  # the model keeps talking: nobody hears it
    await session.send(response_done("r1"))
    await session.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": 5.0, "item_id": "u2"})
    assert (await anext(events)).type == "input_audio_buffer.speech_started"
    await settle(session, 2)
    assert [m["type"] for m in session.received[1:]] == ["playback.ack"]
    await conversation.close()
