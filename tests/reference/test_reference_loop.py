"""The reference model through the runner: real speech in, real speech out."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from devtools.speech import speak, transcribe, words
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from tests.runtime.drivers import RunnerDriver

RATE = 16000
QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")


@pytest.fixture
async def reference():
    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    driver = await RunnerDriver.open(backend)
    await driver.send({"type": "session.update", "session": {"input_sample_rate": RATE}})
    await driver.until("session.created")
    yield driver, plugin
    await driver.close()
    await backend.close()


def reply_audio(events: list[dict], response_id: str) -> tuple[np.ndarray, int]:
    deltas = [e for e in events if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id]
    assert deltas, "no audio in the reply"
    pcm = b"".join(base64.b64decode(d["delta"]) for d in deltas)  # the driver gives wire JSON: pcm16
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768, deltas[0]["sample_rate"]


async def test_spoken_question_gets_a_spoken_reply(reference):
    driver, _ = reference
    await driver.append(speak(QUESTION, before_ms=300, after_ms=1200))
    heard, seen = await driver.until("conversation.item.input_audio_transcription.completed", timeout=20)
    assert {"book", "table", "two"} <= set(words(heard["transcript"]))
    done, more = await driver.until("response.done", timeout=30)
    assert done["status"] == "completed"
    audio, rate = reply_audio(seen + more, done["response_id"])
    assert rate == 22050
    said = words(transcribe(audio, rate))
    assert said[:2] == ["you", "said"] and {"book", "table"} <= set(said), said
    # Every audio delta names the words it speaks.
    marks = [m["text"] for e in more if e["type"] == "response.output_audio.delta" for m in e["marks"]]
    assert marks[0].lower().startswith("you said")


async def test_talking_over_a_long_reply(reference):
    driver, plugin = reference
    await driver.append(speak(LONG, before_ms=300, after_ms=1200))
    created, _ = await driver.until("response.created", timeout=30)
    response_id = created["response_id"]
    first, _ = await driver.until("response.output_audio.delta", timeout=30)
    assert first["response_id"] == response_id

    # The caller talks over the agent after hearing 1.2 s of it.
    interruption = speak("Wait, stop please.", before_ms=0, after_ms=1200)
    await driver.append(interruption[: RATE // 2])
    done, seen = await driver.until("response.done", timeout=10)
    assert done["response_id"] == response_id and done["status"] == "cancelled" and done["reason"] == "barge_in"
    assert [e["type"] for e in seen].index("input_audio_buffer.speech_started") < len(seen) - 1
    await driver.send({"type": "playback.ack", "response_id": response_id, "played_ms": 1200})
    await driver.append(interruption[RATE // 2:])

    # The next turn starts; nothing of the old response follows its done but the replies to the client's ack.
    _, after = await driver.until("response.created", timeout=30)
    replies = ("output_audio_buffer.cleared", "playback.acknowledged")
    assert not [e for e in after if e.get("response_id") == response_id and e["type"] not in replies]
    history = plugin.context(driver.runner.session_id).history
    assistant = [h["content"] for h in history if h["role"] == "assistant"]
    assert len(assistant) == 1
    kept = words(assistant[0])
    full = words("You said: " + LONG)
    assert kept and kept == full[: len(kept)] and len(kept) < len(full) // 2, kept
    await driver.until("response.done", timeout=30)


@pytest.mark.parametrize("case", ["silence", "noise", "clipping"])
async def test_bad_audio_is_handled(reference, case):
    driver, _ = reference
    rng = np.random.default_rng(7)
    if case == "silence":
        audio = np.zeros(RATE * 3, np.float32)
    elif case == "noise":
        audio = (0.05 * rng.standard_normal(RATE * 3)).astype(np.float32)
    else:
        audio = np.clip(speak(QUESTION, before_ms=300, after_ms=1200) * 20, -1, 1)
    await driver.append(audio)
    # A marker behind the audio: the session handles its mailbox in order, so every event the
    # audio caused (VAD, commit, the response's opening) comes before the marker's echo.
    await driver.send({"type": "input_dtmf", "digit": "#"})
    _, events = await driver.until("input_dtmf.received", timeout=30)
    kinds = [e["type"] for e in events]
    if "response.created" in kinds:  # then wait for that response to end
        while not {"response.done", "response.listen"} & set(kinds):
            events.append(await driver.recv(timeout=30))
            kinds.append(events[-1]["type"])
    assert "error" not in kinds, events
    if case == "silence":
        assert "input_audio_buffer.speech_started" not in kinds
    if "response.created" in kinds:  # it heard something: it answers or goes back to listening
        assert "response.done" in kinds or "response.listen" in kinds
    # The session still serves a real question.
    await driver.append(speak(QUESTION, before_ms=300, after_ms=1200))
    heard, _ = await driver.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert "table" in words(heard["transcript"])


async def test_thirty_second_monologue(reference):
    driver, _ = reference
    monologue = np.concatenate([speak(LONG, after_ms=300) for _ in range(4)])
    monologue = np.concatenate([monologue, speak(LONG)])[: RATE * 30]
    await driver.append(np.concatenate([monologue, np.zeros(RATE * 2, np.float32)]))
    heard, _ = await driver.until("conversation.item.input_audio_transcription.completed", timeout=60)
    assert "weather" in words(heard["transcript"])
    done, _ = await driver.until("response.done", timeout=120)
    assert done["status"] == "completed"


async def test_wrong_declared_rate(reference):
    driver, _ = reference
    await driver.send({"type": "session.update", "session": {"input_sample_rate": 12345}})
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "unsupported_sample_rate"
    # Audio at 16 kHz sent to a session that was told 16 kHz still works after the error.
    await driver.append(speak(QUESTION, before_ms=300, after_ms=1200))
    heard, _ = await driver.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert "table" in words(heard["transcript"])


async def test_a_caller_who_goes_on_after_a_pause_is_heard_whole(reference):
    """A pause mid-thought ends the turn; the caller goes on before the reply says a word. The first
    part's words are recognised with the rest, in one turn, and the reply answers all of it."""
    driver, _ = reference
    first = speak("I would like to hear about the weather in the mountains this weekend.", before_ms=300,
                  after_ms=900)  # longer than the turn's silence window: the turn ends here
    rest = speak("My family and our two dogs are coming too.", before_ms=0, after_ms=1200)
    await driver.append(np.concatenate([first, rest]))  # faster than real time: the reply has not spoken

    cancelled, seen = await driver.until("response.done", timeout=30)
    assert cancelled["status"] == "cancelled" and cancelled["reason"] == "barge_in"
    assert not [e for e in seen if e["type"] == "response.output_audio.delta"]  # it had said nothing
    committed = [e for e in seen if e["type"] == "input_audio_buffer.committed"]
    deleted = [e for e in seen if e["type"] == "conversation.item.deleted"]
    assert [e["item_id"] for e in deleted] == [committed[0]["item_id"]]  # that turn is now the next one's

    heard, more = await driver.until("conversation.item.input_audio_transcription.completed", timeout=30)
    assert {"weather", "mountains", "family", "dogs"} <= set(words(heard["transcript"])), heard
    assert not [e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"]
    done, rest_seen = await driver.until("response.done", timeout=30)
    assert done["status"] == "completed"
    said = words(transcribe(reply_audio(more + rest_seen, done["response_id"])[0], 22050))
    assert {"weather", "dogs"} <= set(said), said
