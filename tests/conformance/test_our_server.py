"""Our realtime endpoint, driven by a client that speaks vLLM-Omni's documented wire."""

from __future__ import annotations

import base64
import json

import aiohttp
import numpy as np
import pytest

from duplex_agent.agent.protocol.audio import _ALAW, _ULAW
from duplex_agent.plugins.scripted import Script
from tests.support.audio import tone

APPEND = "input_audio_buffer.append"
MANUAL = {"turn_detection": None}

#: The session.update of vLLM-Omni's guide (MiniCPM-o preset), as a vLLM-Omni client sends it.
GUIDE_SESSION = {
    "model": "openbmb/MiniCPM-o-4_5", "modalities": ["audio", "text"],
    "instructions": "You are a concise voice assistant.", "input_audio_format": "pcm16",
    "output_audio_format": "pcm16", "ref_audio": "data:audio/wav;base64,UklGRg==", "turn_detection": None,
    "overlap_policy": "listen_only", "playback_commit_policy": "ack_only", "temperature": 0.7,
    "idle_timeout_s": 300,
}


async def test_the_guides_session_update_opens_a_session_shaped_like_vllm_omnis(our_server):
    _, client, _, _ = await our_server()
    omni = client()
    created = await omni.open(GUIDE_SESSION, event_id="evt_0001")
    session = created["session"]
    assert created["resume_token"] and created["attachment_generation"] == 1
    assert session["object"] == "realtime.session" and session["overlap_policy"] == "listen_only"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert session["capabilities"]["supports_session_resume"] is True
    assert session["turn_detection"] is None
    echo = await omni.recv()
    assert echo["type"] == "session.updated" and echo["session"]["id"] == session["id"]


@pytest.mark.parametrize("update", [
    {"type": "session.update", "instructions": "flat", "turn_detection": None},  # no session object
    {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
                                           "turn_detection": None}},
    {"type": "session.update", "session": {"sample_rate_hz": 24000, "turn_detection": None}},
    {"type": "session.update", "session": {
        "overlap_policy": "barge_in_on_speech",
        "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                           "silence_duration_ms": 500, "min_speech_duration_ms": 96}}},
])
async def test_other_vllm_omni_session_shapes_are_accepted(our_server, update):
    _, client, _, _ = await our_server()
    omni = await client().connect()
    await omni.send(update)
    created, seen = await omni.until("session.created")
    assert not [e for e in seen if e["type"] == "error"]
    rate = created["session"]["audio"]["input"]["format"]["rate"]
    assert rate == (24000 if "24000" in json.dumps(update) else 16000)


def ulaw(samples: np.ndarray) -> bytes:
    """Nearest G.711 mu-law code for each sample (a test encoder; the decoder's table is ITU-T's)."""
    order = np.argsort(_ULAW)
    index = np.clip(np.searchsorted(_ULAW[order], samples), 0, 255)
    return order[index].astype(np.uint8).tobytes()


def alaw(samples: np.ndarray) -> bytes:
    order = np.argsort(_ALAW)
    index = np.clip(np.searchsorted(_ALAW[order], samples), 0, 255)
    return order[index].astype(np.uint8).tobytes()


def test_g711_tables_are_itu_t_g711():
    assert _ULAW[0x00] * 32768 == -32124 and _ULAW[0x80] * 32768 == 32124 and _ULAW[0xFF] == 0
    assert _ALAW[0x55] * 32768 == -8 and _ALAW[0xD5] * 32768 == 8 and _ALAW[0xAA] * 32768 == 32256


ENCODERS = {
    "pcm16": lambda s: (np.clip(s, -1, 1) * 32767).astype("<i2").tobytes(),
    "pcm_s16le": lambda s: (np.clip(s, -1, 1) * 32767).astype("<i2").tobytes(),
    "pcm_f32le": lambda s: s.astype("<f4").tobytes(),
    "g711_ulaw": ulaw,
    "g711_alaw": alaw,
}


@pytest.mark.parametrize(("fmt", "rate", "spelling"), [
    ("pcm16", 16000, "flat"), ("pcm_s16le", 16000, "flat"), ("pcm_f32le", 48000, "flat"),
    ("pcm16", 24000, "object"), ("g711_ulaw", 8000, "flat"), ("g711_alaw", 8000, "object"),
    ("pcm_f32le", 22050, "sample_rate"),
])
async def test_each_append_is_decoded_with_its_own_format_and_rate(our_server, fmt, rate, spelling):
    _, client, _, _ = await our_server(Script(reply=None))
    omni = client()
    await omni.open(MANUAL)  # the session itself says pcm16 at 16 kHz
    samples = tone(300, rate=rate)
    step = rate // 50
    for i in range(0, samples.size, step):
        audio = base64.b64encode(ENCODERS[fmt](samples[i:i + step])).decode()
        event = {"type": APPEND, "audio": audio, "event_id": f"a{i}"}
        if spelling == "object":
            event["format"] = {"type": fmt, "rate": rate}
        elif spelling == "sample_rate":
            event |= {"format": fmt, "sample_rate": rate}
        else:
            event |= {"format": fmt, "sample_rate_hz": rate}
        await omni.send(event)
    await omni.send({"type": "input_audio_buffer.commit"})
    transcript, seen = await omni.until("conversation.item.input_audio_transcription.completed")
    assert not [e for e in seen if e["type"] == "error"]
    # 300 ms at the model's 16 kHz is 15 units of 20 ms, give or take the resampler's delay.
    units = int(transcript["transcript"].split()[1])
    assert 14 <= units <= 16, transcript


BAD_INPUTS = [
    ("not json", "invalid_json", False),
    ("[1, 2]", "bad_event", False),
    ({"type": "no.such.event"}, "unknown_event", True),
    ({"type": APPEND}, "bad_event", True),
    ({"type": APPEND, "audio": "***"}, "bad_audio", True),
    ({"type": APPEND, "audio": "AAAA", "format": "opus"}, "unsupported_audio_format", True),
    ({"type": APPEND, "audio": "AAAA", "sample_rate_hz": -5}, "bad_event", True),
    ({"type": APPEND, "audio": base64.b64encode(b"\x00\x01\x02").decode()}, "bad_event", True),
    ({"type": "session.update", "session": {"input_audio_format": "mp3"}}, "unsupported_audio_format", True),
    ({"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad"}}},
     "unsupported_turn_detection", True),
    ({"type": "session.update", "session": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}},
     "unsupported_turn_detection", True),
    ({"type": "session.update", "session": {"overlap_policy": "barge_in_on_speech"}}, "unsupported_turn_detection", True),
    ({"type": "session.update", "session": {"overlap_policy": "listen_only", "turn_detection": {"type": "server_vad"}}},
     "unsupported_turn_detection", True),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_empty", True),
    ({"type": "response.create"}, "response_create_without_input", True),
    ({"type": "response.cancel"}, "response_not_active", True),
    ({"type": "conversation.item.truncate", "audio_end_ms": 5}, "missing_item_id", True),
    ({"type": "conversation.item.truncate", "item_id": "item_nope", "audio_end_ms": 5}, "item_not_found", True),
    ({"type": "conversation.item.delete"}, "missing_item_id", True),
    ({"type": "conversation.item.delete", "item_id": "item_nope"}, "item_not_found", True),
    ({"type": "conversation.item.retrieve"}, "missing_item_id", True),
    ({"type": "conversation.item.retrieve", "item_id": "item_nope"}, "item_not_found", True),
    ({"type": "conversation.item.create"}, "bad_event", True),
    ({"type": "turn.signal"}, "bad_event", True),
    ({"type": "playback.ack"}, "bad_event", True),
    ({"type": "playback.ack", "played_ms": "soon"}, "bad_event", True),
    ({"type": "playback.ack", "played_ms": 10, "response_id": "resp_nope"}, "playback_item_not_found", True),
    ({"type": "session.event_ack"}, "invalid_event_ack", True),
    ({"type": "session.update", "session": {"idle_timeout_s": -1}}, "bad_event", True),
    ({"type": "input.text.append", "text": "hi"}, "native_text_append_unsupported", True),
    ({"type": "session.event_ack", "server_event_seq": 10 ** 6}, "invalid_event_ack", True),
    ({"type": "session.resume", "session_id": "x", "resume_token": "y"}, "unsupported_session_resume", True),
]


async def test_every_bad_input_gets_vllm_omnis_code_with_the_clients_event_id_and_the_session_serves_on(our_server):
    _, client, _, _ = await our_server(Script(reply="still here"))
    omni = client()
    await omni.open(MANUAL)
    for n, (event, code, has_id) in enumerate(BAD_INPUTS):
        if isinstance(event, dict):
            await omni.send({**event, "event_id": f"evt_bad_{n}"})
        else:
            await omni.send_raw(event)
        error, _ = await omni.until("error")
        assert error["error"]["code"] == code, event
        assert error["error"]["event_id"] == (f"evt_bad_{n}" if has_id else None), event
    await omni.append(tone(200))
    await omni.send({"type": "input_audio_buffer.commit"})
    done, seen = await omni.until("response.done")
    assert done["response"]["status"] == "completed"
    assert next(e for e in seen if e["type"] == "response.output_audio_transcript.done")["transcript"] == "still here"


async def test_frames_up_to_vllm_omnis_limit_are_read_and_larger_ones_get_event_too_large(our_server):
    _, client, _, _ = await our_server()
    omni = client()
    await omni.open(MANUAL)
    await omni.until("session.updated")  # the echo of the opening update
    await omni.send({"type": "session.update", "event_id": "big", "session": {"instructions": "x" * (14 << 20)}})
    updated, _ = await omni.until("session.updated", timeout=30)
    assert len(updated["session"]["instructions"]) == 14 << 20
    await omni.send({"type": APPEND, "event_id": "huge", "audio": "A" * (15 << 20)})
    error, _ = await omni.until("error", timeout=30)
    assert error["error"]["code"] == "event_too_large"
    await omni.send({"type": "session.heartbeat"})
    await omni.until("session.heartbeat_ack")  # still serving


async def test_heartbeat_and_close(our_server):
    _, client, _, _ = await our_server()
    omni = client()
    created = await omni.open(MANUAL)
    await omni.send({"type": "session.heartbeat"})
    ack, _ = await omni.until("session.heartbeat_ack")
    assert ack["session_id"] == created["session"]["id"]
    await omni.send({"type": "session.close"})
    closed, _ = await omni.until("session.closed")
    assert closed["reason"] == "client_close"
    with pytest.raises(ConnectionError):
        await omni.recv(timeout=5)
    assert omni.ws is not None and omni.ws.close_code == 1000


async def test_the_wire_controls_are_answered_after_everything_sent_before_them(our_server):
    """vLLM-Omni answers ``session.heartbeat``, ``turn.signal`` and ``input.text.append`` in its command
    order, so a client can fence on a heartbeat's ack."""
    _, client, _, _ = await our_server()
    omni = client()
    await omni.open(MANUAL)
    await omni.until("session.updated")  # the echo of the opening update
    await omni.append(tone(3000))  # 150 appends keep the session's mailbox busy when the rest arrives
    await omni.send({"type": "input_audio_buffer.clear"})
    await omni.send({"type": "turn.signal", "event": "wave"})
    await omni.send({"type": "input.text.append", "text": "hello", "event_id": "evt_text"})
    await omni.send({"type": "conversation.item.retrieve", "item_id": "item_unknown", "event_id": "evt_retrieve"})
    await omni.send({"type": "session.heartbeat"})
    _, seen = await omni.until("session.heartbeat_ack")
    kinds = [event["type"] for event in seen]
    assert kinds[-5:] == ["input_audio_buffer.cleared", "turn.event", "error", "error", "session.heartbeat_ack"], kinds
    assert [seen[i]["error"]["code"] for i in (-3, -2)] == ["native_text_append_unsupported", "item_not_found"]
    assert [seen[i]["error"]["event_id"] for i in (-3, -2)] == ["evt_text", "evt_retrieve"]


async def test_duplex_query_spellings(our_server):
    url, client, _, _ = await our_server()
    base = url.split("?")[0]
    for query in ("?duplex=on", "?duplex=true", ""):
        omni = client()
        omni.url = base
        await omni.connect(query)
        await omni.send({"type": "session.update", "session": MANUAL})
        await omni.until("session.created")
    async with aiohttp.ClientSession() as http, http.get(base.replace("ws", "http", 1) + "?duplex=0") as reply:
        assert reply.status == 400 and "Realtime API is not available" in await reply.text()


async def test_a_first_event_other_than_session_update_opens_a_default_session(our_server):
    _, client, _, _ = await our_server()
    omni = await client().connect()
    await omni.send({"type": "session.heartbeat"})
    await omni.until("session.created")
    await omni.until("session.heartbeat_ack")


async def test_a_refused_first_update_is_answered_and_the_socket_closes(our_server):
    _, client, _, _ = await our_server()
    omni = await client().connect()
    await omni.send({"type": "session.update", "event_id": "evt_1", "session": {"input_audio_format": "mp3"}})
    error = await omni.recv()
    assert error["error"]["code"] == "unsupported_audio_format" and error["error"]["event_id"] == "evt_1"
    with pytest.raises(ConnectionError):
        await omni.recv(timeout=5)


async def test_every_other_client_event_of_the_vocabulary_is_served(our_server):
    _, client, _, _ = await our_server(Script(reply="one two three four five", word_delay_s=0.05))
    omni = client()
    await omni.open(MANUAL)
    await omni.send({"type": "session.event_ack", "server_event_seq": omni.last_seq})
    # input.commit (alias) without a response, then response.create.
    await omni.append(tone(200))
    await omni.send({"type": "input.commit", "response_create": False})
    await omni.until("input_audio_buffer.committed")
    await omni.send({"type": "response.create", "event_id": "evt_rc"})
    created, _ = await omni.until("response.created")
    done, seen = await omni.until("response.done")
    response_id = created["response_id"]
    item_id = created["item_id"]
    marks = [m for e in seen if e["type"] == "response.output_audio.delta" for m in e["metadata"]["audio_text_marks"]]
    assert marks[-1]["text_chars"] == len("one two three four five")
    # Playback: an ack naming nothing is about the latest response; the alias too.
    await omni.send({"type": "playback.ack", "played_ms": 150})
    acked, _ = await omni.until("playback.acknowledged")
    assert acked["event"]["played_ms"] == 150 and acked["event"]["item_id"] == item_id
    await omni.send({"type": "audio.playback_ack", "response_id": response_id, "played_ms": 200, "committed_ms": 200})
    await omni.until("playback.acknowledged")
    await omni.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                     "audio_end_ms": 200})
    truncated, _ = await omni.until("conversation.item.truncated")
    assert truncated["item_id"] == item_id and truncated["audio_end_ms"] == 200
    await omni.send({"type": "conversation.item.retrieve", "item_id": item_id})
    retrieved, _ = await omni.until("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["transcript"] == "one two"  # the words heard by 200 ms
    await omni.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "noted"}]}})
    item, _ = await omni.until("conversation.item.created")
    await omni.send({"type": "conversation.item.delete", "item_id": item["item"]["id"]})
    await omni.until("conversation.item.deleted")
    # Input: clear and cancel both answer input_audio_buffer.cleared.
    await omni.append(tone(60))
    await omni.send({"type": "input_audio_buffer.clear"})
    await omni.until("input_audio_buffer.cleared")
    await omni.send({"type": "input.cancel"})
    await omni.until("input_audio_buffer.cleared")
    # Turn signals: a barge-in in disguise, and one the session only acknowledges.
    await omni.send({"type": "turn.signal", "event": "user_turn_hint", "payload": {"source": "client_vad"}})
    await omni.until("turn.event")
    # Interrupting a reply: barge_in, then output_audio_buffer.clear on the next one.
    for interrupt in ({"type": "barge_in"}, {"type": "turn.signal", "event": "barge_in"},
                      {"type": "output_audio_buffer.clear"}, {"type": "response.cancel"}):
        await omni.append(tone(200))
        await omni.send({"type": "input_audio_buffer.commit"})
        await omni.until("response.output_audio.delta")
        await omni.send(interrupt)
        cancelled, seen = await omni.until("response.done")
        assert cancelled["response"]["status"] == "cancelled", interrupt
        kinds = [e["type"] for e in seen]
        if "output_audio_buffer.cleared" in kinds:
            assert kinds.index("output_audio_buffer.cleared") < kinds.index("response.done")  # cleared comes first
    assert not [e for e in omni.seen if e["type"] == "error"]


async def test_a_commit_to_a_model_native_session_seals_the_item(our_server):
    _, client, _, _ = await our_server(Script(input_mode="continuous"))
    omni = client()
    created = await omni.open({"turn_detection": None, "overlap_policy": "listen_only"})
    assert created["session"]["capabilities"]["implementation_level"] == "model_native_duplex"
    await omni.append(tone(100))
    await omni.send({"type": "input_audio_buffer.commit", "final": True, "response_create": False})
    committed, seen = await omni.until("input_audio_buffer.committed")
    assert committed["item_id"] and not [e for e in seen if e["type"] == "error"]


@pytest.mark.parametrize(("alias", "answer"), [
    ({"type": "close"}, "session.closed"),
    ({"type": "close_session"}, "session.closed"),
    ({"type": "push_text", "text": "hi"}, "error"),
    ({"type": "input_text.append", "text": "hi"}, "error"),
    ({"type": "signal_turn", "event": "user_turn_hint"}, "turn.event"),
])
async def test_vllm_omnis_aliases(our_server, alias, answer):
    _, client, _, _ = await our_server()
    omni = client()
    await omni.open(MANUAL)
    await omni.send(alias)
    reply, _ = await omni.until(answer)
    if answer == "error":
        assert reply["error"]["code"] == "native_text_append_unsupported"
