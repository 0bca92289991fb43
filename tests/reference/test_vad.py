import sys

import numpy as np
import pytest

from duplex_agent.agent.models.model_errors import MissingModelError
from duplex_agent.agent.models.vad import SharedScores, SileroVadModel, VadEvent, VadSettings, VadStream

SR = 16000
PAD_S = 1.0


@pytest.fixture(scope="module")
def model() -> SileroVadModel:
    return SileroVadModel.shared()


def true_bounds_ms(speech: np.ndarray) -> tuple[float, float]:
    """First and last 10 ms frame of speech above -40 dBFS, relative to the speech start."""
    frames = speech[: speech.size // 160 * 160].reshape(-1, 160)
    loud = np.flatnonzero(np.sqrt(np.mean(frames**2, axis=1)) > 0.01)
    return loud[0] * 10.0, (loud[-1] + 1) * 10.0


def push_in_chunks(stream: VadStream, audio: np.ndarray, sizes=(160, 1000, 333, 4096)):
    """Push audio in uneven chunks; return (event, stream position when it was returned)."""
    out = []
    i = k = 0
    while i < audio.size:
        chunk = audio[i : i + sizes[k % len(sizes)]]
        i += chunk.size
        k += 1
        out += [(event, stream.position_ms) for event in stream.push(chunk)]
    return out


def test_shared_model_is_loaded_once(model):
    assert SileroVadModel.shared() is model


def test_missing_package_names_pip_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "livekit.local_inference", None)
    with pytest.raises(MissingModelError, match="pip install livekit-local-inference"):
        SileroVadModel()


def test_speech_with_silence_padding(model, fox_16k):
    pad = np.zeros(int(PAD_S * SR), dtype=np.float32)
    audio = np.concatenate([pad, fox_16k, pad])
    onset, offset = (PAD_S * 1000 + t for t in true_bounds_ms(fox_16k))
    stream = VadStream(model, silence_duration_ms=500, min_speech_ms=100)
    events = push_in_chunks(stream, audio)

    assert [e.kind for e, _ in events] == ["speech_started", "speech_stopped"]
    (started, started_at), (stopped, stopped_at) = events
    assert abs(started.audio_ms - onset) <= 100
    assert started_at >= started.audio_ms + 100  # reported after min_speech_ms of speech
    assert abs(stopped.audio_ms - offset) <= 250
    assert stopped_at >= stopped.audio_ms + 500  # reported after silence_duration_ms
    assert not stream.speaking
    assert 0.0 <= stream.last_probability <= 1.0


def test_chunking_does_not_change_events(model, fox_16k):
    audio = np.concatenate([np.zeros(8000, np.float32), fox_16k, np.zeros(16000, np.float32)])
    whole = VadStream(model).push(audio)
    chunked = [e for e, _ in push_in_chunks(VadStream(model), audio, sizes=(512 * 3 + 7, 100))]
    assert whole == chunked
    assert len(whole) == 2


def test_reset_keeps_the_input_timeline(model, fox_16k):
    """After reset, events are found again, at positions on the same input timeline (and its
    512-sample window grid, so another stream's scores for window k still apply)."""
    stream = VadStream(model)
    audio = np.concatenate([np.zeros(8000, np.float32), fox_16k, np.zeros(16000, np.float32)])
    first = stream.push(audio)
    stream.push(np.zeros(100, np.float32))
    stream.reset()
    assert not stream.speaking
    offset = 1000.0 * (audio.size + 100) / SR
    again = stream.push(audio)
    assert [e.kind for e in again] == [e.kind for e in first]
    # Same timeline: each event again, shifted by what was pushed before (a few windows of slack:
    # one run in a full suite with a busy core placed an edge more than one window off).
    shifts = [b.audio_ms - a.audio_ms for a, b in zip(first, again)]
    assert all(abs(shift - offset) <= 96 for shift in shifts), (shifts, offset)
    assert all(e.audio_ms % 32 == 0 for e in again)


def test_a_stream_reading_shared_scores_runs_no_model_and_finds_the_same_speech(model, fox_16k):
    audio = np.concatenate([np.zeros(8000, np.float32), fox_16k, np.zeros(16000, np.float32)])
    scores = SharedScores()
    edge = VadStream(model, min_speech_ms=32, silence_duration_ms=300, scores_out=scores)
    turns, alone = VadStream(model, scores_in=scores), VadStream(model)
    shared_events, own_events = [], []
    for i in range(0, audio.size, 320):
        edge.push(audio[i : i + 320])
        shared_events += turns.push(audio[i : i + 320])
        own_events += alone.push(audio[i : i + 320])
    assert shared_events == own_events and len(own_events) == 2
    assert turns.windows_scored == 0 and edge.windows_scored == alone.windows_scored > 0


def test_speaking_while_speech_continues(model, fox_16k):
    stream = VadStream(model)
    stream.push(np.zeros(8000, np.float32))
    events = stream.push(fox_16k[: SR])
    assert events == [VadEvent("speech_started", events[0].audio_ms)]
    assert stream.speaking
    assert len(stream.probabilities) == (8000 + SR) // 512 - 8000 // 512


@pytest.mark.parametrize(
    "audio",
    [
        np.zeros(5 * SR, dtype=np.float32),
        (np.random.default_rng(0).standard_normal(5 * SR) * 0.01).astype(np.float32),
    ],
    ids=["silence", "white-noise-40dBFS"],
)
def test_no_events_without_speech(model, audio):
    stream = VadStream(model)
    assert stream.push(audio) == []
    assert not stream.speaking


def test_settings_from_dict():
    s = VadSettings.from_dict(
        {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 700, "create_response": False}
    )
    assert (s.threshold, s.silence_duration_ms, s.prefix_padding_ms, s.create_response) == (0.6, 700, 300, False)
    stream = s.new_stream(SileroVadModel.shared())
    assert (stream.threshold, stream.silence_duration_ms) == (0.6, 700)
    assert (s.end_of_turn, s.end_of_turn_threshold, s.end_of_turn_silence_ms) == (True, 0.5, 200)


def test_settings_take_vllm_omni_min_speech_duration_ms():
    assert VadSettings.from_dict({"min_speech_duration_ms": 250}).min_speech_ms == 250
    assert VadSettings.from_dict({"min_speech_ms": 80, "min_speech_duration_ms": 80}).min_speech_ms == 80


def test_short_full_window_bounds_the_default_short_window():
    assert VadSettings.from_dict({"silence_duration_ms": 150}).end_of_turn_silence_ms == 150


@pytest.mark.parametrize(
    "d, key",
    [
        ({"bogus": 1}, "bogus"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": "high"}, "threshold"),
        ({"silence_duration_ms": -1}, "silence_duration_ms"),
        ({"prefix_padding_ms": True}, "prefix_padding_ms"),
        ({"interrupt_response": "yes"}, "interrupt_response"),
        ({"type": "semantic_vad"}, "type"),
        ({"threshold": float("nan")}, "threshold"),
        ({"min_speech_duration_ms": -5}, "min_speech_duration_ms"),
        ({"min_speech_ms": 100, "min_speech_duration_ms": 200}, "min_speech_duration_ms"),
        ({"end_of_turn": "auto"}, "end_of_turn"),
        ({"end_of_turn_threshold": 2}, "end_of_turn_threshold"),
        ({"end_of_turn_silence_ms": 900}, "end_of_turn_silence_ms"),  # longer than the full window
        ({"end_of_turn_silence_ms": [200]}, "end_of_turn_silence_ms"),
    ],
)
def test_settings_reject_bad_keys(d, key):
    with pytest.raises(ValueError, match=key) as info:
        VadSettings.from_dict(d)
    assert info.value.key == key


class ScriptedScorer:
    """Probabilities from a script, one per window: the stream's rules without the network."""

    def __init__(self, script: list[float]) -> None:
        self.script = list(script)

    def probability(self, window: np.ndarray) -> float:
        return self.script.pop(0)

    def reset(self) -> None:
        pass


class ScriptedModel:
    def __init__(self, script: list[float]) -> None:
        self.script = script

    def open_stream(self) -> ScriptedScorer:
        return ScriptedScorer(self.script)


def windows_at(levels_db: list[float]) -> np.ndarray:
    """One 32 ms window of noise per level (dBFS RMS)."""
    noise = np.random.default_rng(1).standard_normal((len(levels_db), 512))
    noise /= np.sqrt(np.mean(noise**2, axis=1, keepdims=True))
    return (noise * 10.0 ** (np.array(levels_db)[:, None] / 20.0)).astype(np.float32).reshape(-1)


def test_windows_scored_as_speech_30_db_under_the_onsets_loudest_or_in_silence_are_not_speech():
    """A grunt and the ring-down Opus lets follow it: windows Silero scores as speech, 40-60 dB
    down, do not add to the onset; digital silence, which the network still hears the grunt in,
    scores 0 and ends it."""
    levels = [-20.0, -52.0, -56.0, -64.0, -100.0, -20.0, -25.0, -30.0]
    stream = VadStream(ScriptedModel([0.9] * 8), min_speech_ms=100)
    assert stream.push(windows_at(levels)) == [] and not stream.speaking
    assert [round(level) for level in stream.levels] == [round(level) for level in levels]
    assert stream.probabilities[4] == 0.0  # under SILENCE_DBFS, whatever the network scored
    # the same scores at speech's own levels start speech at the first window
    stream = VadStream(ScriptedModel([0.9, 0.9, 0.9, 0.9, 0.1]), min_speech_ms=100)
    assert stream.push(windows_at([-20.0, -30.0, -40.0, -45.0, -90.0])) == [VadEvent("speech_started", 0.0)]
