"""The reference model says a given text (our ``response.say``), word for word, as its own reply,
before anything was said to it (a bare ``response.create`` is still refused there); an empty or oversized text is refused with the field named."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from devtools.speech import transcribe, words
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from tests.runtime.drivers import RunnerDriver

GREETING = "Hello, this is the dental office calling about your appointment."


@pytest.fixture
async def reference():
    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1)
    driver = await RunnerDriver.open(backend)
    yield driver, plugin
    await driver.close()
    await backend.close()


async def test_the_reference_model_says_a_given_text_before_anyone_spoke(reference):
    driver, plugin = reference
    assert driver.runner.capabilities.speaks_given_text
    await driver.send({"type": "session.update", "session": {"input_sample_rate": 16000}})
    await driver.until("session.created")
    await driver.send({"type": "response.create", "event_id": "evt_empty", "response": {"say": "  "}})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "invalid_field" and error["error"]["param"] == "response.say"

    await driver.send({"type": "response.create", "event_id": "evt_bare"})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "no_committed_input"

    await driver.send({"type": "response.create", "response": {"say": GREETING}})
    done, seen = await driver.until("response.done", timeout=60)
    assert done["status"] == "completed", done
    deltas = [e for e in seen if e["type"] == "response.output_audio.delta"]
    audio = np.frombuffer(b"".join(base64.b64decode(d["delta"]) for d in deltas), "<i2").astype(np.float32) / 32768
    assert {"dental", "office", "appointment"} <= set(words(transcribe(audio, deltas[0]["sample_rate"])))
    transcript = next(e for e in seen if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert transcript == GREETING
    await driver.send({"type": "response.create", "event_id": "evt_more", "response": {"say": "x" * 1001}})
    error, _ = await driver.until("error")
    assert error["error"]["param"] == "response.say"
