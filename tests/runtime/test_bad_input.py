"""Each bad input gets a typed error with vLLM-Omni's code, and the session keeps serving.

(tests/conformance covers the whole vocabulary; these are the runtime's own refusals.)"""

from __future__ import annotations

import base64
import json

import pytest

from duplex_agent.plugins.scripted import Script
from tests.support.audio import tone

APPEND = "input_audio_buffer.append"

BAD_INPUTS = [
    ("not json", "invalid_json"),
    (json.dumps([1, 2]), "bad_event"),
    (json.dumps({"type": "no.such.event"}), "unknown_event"),
    (json.dumps({"type": APPEND}), "bad_event"),
    (json.dumps({"type": APPEND, "audio": 12}), "bad_event"),
    (json.dumps({"type": APPEND, "audio": "***not base64***"}), "bad_audio"),
    (json.dumps({"type": APPEND, "audio": base64.b64encode(b"\x00\x01\x02").decode()}), "bad_event"),
    (json.dumps({"type": APPEND, "audio": "AAAA", "format": "mp3"}), "unsupported_audio_format"),
    (json.dumps({"type": "session.update", "session": {"input_audio_format": "opus"}}), "unsupported_audio_format"),
    (json.dumps({"type": "session.update", "session": {"input_sample_rate": 12345}}), "unsupported_sample_rate"),
    (json.dumps({"type": APPEND, "audio": "A" * (16 << 20)}), "event_too_large"),
    (json.dumps({"type": "session.update", "session": {"extra_body": {"engine_seed": 1}}}), "private_runtime_key"),
    (json.dumps({"type": "session.update", "session": {"input_sample_rate": 48000}}), "session_field_immutable"),
    (json.dumps({"type": "session.update", "session": {"turn_detection": {"type": "server_vad", "bogus": 1}}}),
     "unsupported_turn_detection"),
    (json.dumps({"type": "session.update", "session": {"no_such_field": 1}}), "unknown_session_field"),
    (json.dumps({"type": "response.cancel"}), "response_not_active"),
    (json.dumps({"type": "playback.ack", "response_id": "resp_nope", "played_ms": 10}), "playback_item_not_found"),
    (json.dumps({"type": "input_dtmf", "digit": "x"}), "bad_event"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_empty"),
]


async def test_every_bad_input_gets_its_code_and_the_session_serves_on(open_driver):
    driver, _, _ = await open_driver(Script(reply="still here"), transport="websocket")
    await driver.send({"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": 16000}})
    await driver.until("session.created")
    for raw, code in BAD_INPUTS:
        await driver.send_raw(raw)
        error, _ = await driver.until("error")
        assert error["error"]["code"] == code, raw[:80]
        assert set(error["error"]) == {"type", "code", "message", "event_id"}
    # Errors carry the offending event's id when it had one.
    await driver.send({"type": "no.such.event", "event_id": "evt_42"})
    error, _ = await driver.until("error")
    assert error["error"]["event_id"] == "evt_42"
    # Still serving.
    await driver.append(tone(200))
    await driver.send({"type": "input_audio_buffer.commit"})
    done, seen = await driver.until("response.done")
    assert done["status"] == "completed"
    assert "still" in [d["marks"][0]["text"] for d in seen if d["type"] == "response.output_audio.delta"]


async def test_pcm_f32le_at_another_rate_is_resampled(open_driver):
    import numpy as np

    driver, plugin, _ = await open_driver(Script(), transport="websocket")
    await driver.send({"type": "session.update",
                       "session": {"turn_detection": None, "input_audio_format": "pcm_f32le", "input_sample_rate": 48000}})
    await driver.until("session.created")
    t = np.arange(48000 * 3 // 10) / 48000  # 300 ms at 48 kHz
    samples = (0.3 * np.sin(2 * np.pi * 300 * t)).astype("<f4")
    for i in range(0, len(samples), 960):
        await driver.send({"type": APPEND, "audio": base64.b64encode(samples[i:i + 960].tobytes()).decode()})
    await driver.send({"type": "input_audio_buffer.commit"})
    transcript, _ = await driver.until("conversation.item.input_audio_transcription.completed")
    # 300 ms at 16 kHz is 15 units of 20 ms, give or take the resampler's delay.
    units = int(transcript["transcript"].split()[1])
    assert 14 <= units <= 16


async def test_another_first_event_opens_a_default_session_then_applies(open_driver):
    driver, _, _ = await open_driver(Script(), transport="websocket")
    await driver.send({"type": "input_audio_buffer.commit", "event_id": "evt_1"})
    await driver.until("session.created")
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "input_audio_buffer_empty" and error["error"]["event_id"] == "evt_1"


async def test_config_timeout(open_driver):
    driver, _, _ = await open_driver(Script(), transport="websocket", config_timeout_s=0.3)
    error = await driver.recv(timeout=3)
    assert error["error"]["code"] == "config_timeout"
    with pytest.raises(ConnectionError):
        await driver.recv(timeout=3)


async def test_endpoint_requires_duplex_flag(open_driver):
    import aiohttp

    driver, _, _ = await open_driver(Script(), transport="websocket")
    async with aiohttp.ClientSession() as http, http.get(driver.server.make_url("/v1/realtime?duplex=0")) as reply:
        assert reply.status == 400
        assert "Realtime API is not available" in await reply.text()
