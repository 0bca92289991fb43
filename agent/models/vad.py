"""Voice activity detection: Silero VAD v5, run natively, with cheap per-session streams.

The network comes from ``livekit-local-inference`` (a dependency of livekit-agents): the
same Silero v5 weights compiled into a native library that keeps each stream's LSTM
state and 64-sample context itself and releases the GIL, about a sixth of the cost
of a call through onnxruntime with the same probabilities (within 0.015: int16 input).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from duplex_agent.agent.models.model_errors import require_module
from duplex_agent.agent.models.shared_model import SharedModel

logger = logging.getLogger("duplex_agent.models")

VAD_RATE = 16000
WINDOW_SAMPLES = 512  # samples per model call at 16 kHz (32 ms)
#: Silero's state carries a speech score past the end of a sound: into the ~100 ms Opus's
#: decoder lets a short sound ring on, 40-60 dB down, and into the silence after it. Through
#: Opus a 48 ms grunt was four windows of "speech", the minimum speech, in some alignments
#: (python -m bench.false_pauses --opus). So a window scored as speech adds to an onset only
#: within this many dB of the onset's loudest window so far (further under, it neither adds
#: nor ends it: a stop consonant's closure inside a word is as quiet), and a window under
#: SILENCE_DBFS scores 0.
SPEECH_LEVEL_SPAN_DB = 30.0
SILENCE_DBFS = -70.0  # far under any microphone's noise floor: digital silence, a codec's rounding


def to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def level_db(window: np.ndarray) -> float:
    """A window's RMS level in dB against full scale (-120 for digital silence)."""
    return 10.0 * float(np.log10(float(np.dot(window, window)) / max(window.size, 1) + 1e-12))


class OnsetLevel:
    """The loudest window of an onset so far, and whether a window is loud enough to count
    toward it (SPEECH_LEVEL_SPAN_DB)."""

    def __init__(self) -> None:
        self.peak_db: float | None = None

    def counts(self, level: float) -> bool:
        """Take one of the onset's windows scored as speech: whether it adds to the onset."""
        self.peak_db = level if self.peak_db is None else max(self.peak_db, level)
        return level >= self.peak_db - SPEECH_LEVEL_SPAN_DB

    def hear(self, level: float) -> None:
        """Take one of the onset's other windows (they may be its loudest)."""
        if self.peak_db is not None:
            self.peak_db = max(self.peak_db, level)

    def reset(self) -> None:
        self.peak_db = None


class WindowScorer(Protocol):
    """One stream's speech probability, window by window (the network's state lives here)."""

    def probability(self, window: np.ndarray) -> float: ...
    def reset(self) -> None: ...


class _NativeScorer:
    def __init__(self, native: Any) -> None:
        self._native = native

    def probability(self, window: np.ndarray) -> float:
        return float(self._native.predict(to_int16(window)))

    def reset(self) -> None:
        self._native.reset()


class SileroVadModel(SharedModel):
    """Silero VAD v5 (native, from livekit-local-inference); weights loaded once per process."""

    def __init__(self) -> None:
        self._lib = require_module("livekit.local_inference", "livekit-local-inference")
        start = time.perf_counter()
        self._lib.init_vad()
        assert self._lib.VAD_WINDOW_SAMPLES == WINDOW_SAMPLES
        logger.info("Silero VAD loaded in %.2f s", time.perf_counter() - start)

    def open_stream(self) -> WindowScorer:
        """A scorer with its own state; every scorer shares the loaded weights."""
        return _NativeScorer(self._lib.VAD())


class VadModel(Protocol):
    def open_stream(self) -> WindowScorer: ...


class SharedScores:
    """One call's window probabilities, scored once by the edge's VadStream and read by the
    session's (one VAD pass per call). Windows are numbered on the call's 16 kHz input
    timeline: window k covers samples [512 k, 512 (k + 1)), whatever resampler fed it."""

    def __init__(self, keep: int = 256) -> None:  # 8 s of windows
        self._scores: dict[int, float] = {}
        self._keep = keep

    def put(self, index: int, probability: float) -> None:
        self._scores[index] = probability
        self._scores.pop(index - self._keep, None)

    def get(self, index: int) -> float | None:
        return self._scores.get(index)


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: float  # position on the stream's input timeline, ms since its start


def release_threshold(threshold: float) -> float:
    """The probability under which speech (or a candidate onset) ends: hysteresis as in
    Silero's reference iterator, speech continues until it falls clearly below ``threshold``."""
    return max(threshold - 0.15, 0.01)


class VadStream:
    """Per-session VAD state: buffers audio, scores each 32 ms window, emits events.

    speech_started is emitted once min_speech_ms of speech has been seen; its audio_ms is the
    onset of that speech. speech_stopped is emitted once silence_duration_ms of silence has
    followed (or less, for this pause only, after ``end_pause_after``); its audio_ms is the
    end of the speech. prefix_padding_ms is kept for the caller, which decides how much audio
    before the onset to include in a turn.
    """

    def __init__(
        self,
        model: VadModel,
        *,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        min_speech_ms: int = 100,
        sample_rate: int = VAD_RATE,
        scores_out: SharedScores | None = None,
        scores_in: SharedScores | None = None,
    ) -> None:
        if sample_rate != VAD_RATE:
            raise ValueError(f"sample_rate must be {VAD_RATE}, got {sample_rate}")
        self._scorer = model.open_stream()
        self.sample_rate = sample_rate
        self.window_ms = 1000.0 * WINDOW_SAMPLES / sample_rate
        self.tune(threshold=threshold, prefix_padding_ms=prefix_padding_ms,
                  silence_duration_ms=silence_duration_ms, min_speech_ms=min_speech_ms)
        self.scores_out = scores_out  # this stream scores windows for another
        self.scores_in = scores_in  # this stream reads another's scores
        self.windows_scored = 0  # model calls this stream made
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows_start = 0  # samples of the input timeline already in windows
        self.reset()

    def tune(self, *, threshold: float, prefix_padding_ms: int, silence_duration_ms: int,
             min_speech_ms: int) -> None:
        """New settings, keeping the stream's timeline and state."""
        self.threshold = threshold
        self.release_threshold = release_threshold(threshold)
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.min_speech_ms = min_speech_ms

    def reset(self) -> None:
        """Forget speech state; positions keep counting on the input timeline, and windows
        stay on its 512-sample grid (the remainder short of a window is kept)."""
        self._scorer.reset()
        self._speaking = False
        self._onset_ms: float | None = None  # candidate onset while not yet speaking
        self._onset_level = OnsetLevel()
        self._speech_run_ms = 0.0
        self._speech_end_ms = 0.0
        self._silence_run_ms = 0.0
        self._pause_window_ms = float(self.silence_duration_ms)
        self.last_probability = 0.0
        self.probabilities: list[float] = []  # one per window of the last push, for metering
        self.levels: list[float] = []  # the same windows' levels (dBFS)

    @property
    def speaking(self) -> bool:
        return self._speaking

    @property
    def position_ms(self) -> float:
        """End of the audio analysed so far (buffered remainders excluded)."""
        return 1000.0 * self._windows_start / self.sample_rate

    @property
    def silence_ms(self) -> float:
        """Silence so far in the current pause (0 while not in speech or while sounding)."""
        return self._silence_run_ms if self._speaking else 0.0

    @property
    def speech_end_ms(self) -> float:
        """End of the last window of speech in the current turn."""
        return self._speech_end_ms

    def push(self, samples: np.ndarray) -> list[VadEvent]:
        """Consume mono float32 audio at 16 kHz, of any length; return new events."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        audio = np.concatenate((self._pending, samples)) if self._pending.size else samples
        n_windows = audio.size // WINDOW_SAMPLES
        self._pending = audio[n_windows * WINDOW_SAMPLES :].copy()
        self.probabilities = []
        self.levels = []
        events: list[VadEvent] = []
        for i in range(n_windows):
            event = self._step(audio[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES])
            if event is not None:
                events.append(event)
        return events

    def end_pause_after(self, silence_ms: float) -> VadEvent | None:
        """Let the current pause end the speech after ``silence_ms`` instead of the full window.

        Returns speech_stopped now if that much silence has already passed; otherwise a
        later push emits it, unless speech resumes first (which restores the full window).
        """
        if not self._speaking or self._silence_run_ms == 0.0:
            return None
        self._pause_window_ms = min(self._pause_window_ms, silence_ms)
        if self._silence_run_ms >= self._pause_window_ms:
            return self._stop()
        return None

    def _step(self, window: np.ndarray) -> VadEvent | None:
        index = self._windows_start // WINDOW_SAMPLES
        prob = self.scores_in.get(index) if self.scores_in is not None else None
        if prob is None:
            prob = self._scorer.probability(window)
            self.windows_scored += 1
        level = level_db(window)
        if level < SILENCE_DBFS:
            prob = 0.0  # the network's state still hears the sound before (SPEECH_LEVEL_SPAN_DB)
        if self.scores_out is not None:
            self.scores_out.put(index, prob)
        self.last_probability = prob
        self.probabilities.append(prob)
        self.levels.append(level)
        start_ms = self.position_ms
        self._windows_start += WINDOW_SAMPLES
        end_ms = self.position_ms

        if not self._speaking:
            if prob >= self.threshold:
                if not self._onset_level.counts(level):
                    return None  # a ring-down after a short sound (SPEECH_LEVEL_SPAN_DB)
                if self._onset_ms is None:
                    self._onset_ms = start_ms
                self._speech_run_ms += self.window_ms
                if self._speech_run_ms >= self.min_speech_ms:
                    self._speaking = True
                    self._speech_end_ms = end_ms
                    self._silence_run_ms = 0.0
                    return VadEvent("speech_started", self._onset_ms)
            elif prob < self.release_threshold:
                self._onset_ms = None
                self._speech_run_ms = 0.0
                self._onset_level.reset()
            else:
                self._onset_level.hear(level)
            return None

        if prob >= self.release_threshold:
            self._speech_end_ms = end_ms
            self._silence_run_ms = 0.0
            self._pause_window_ms = float(self.silence_duration_ms)
            return None
        self._silence_run_ms += self.window_ms
        if self._silence_run_ms < self._pause_window_ms:
            return None
        return self._stop()

    def _stop(self) -> VadEvent:
        self._speaking = False
        self._onset_ms = None
        self._onset_level.reset()
        self._speech_run_ms = 0.0
        self._silence_run_ms = 0.0
        self._pause_window_ms = float(self.silence_duration_ms)
        return VadEvent("speech_stopped", self._speech_end_ms)


class VadSettingsError(ValueError):
    """A bad turn-detection setting; `key` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key!r}: {message}")
        self.key = key


def _number(d: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise VadSettingsError(key, f"must be a number, got {value!r}")
    if not low <= value <= high:
        raise VadSettingsError(key, f"must be between {low} and {high}, got {value!r}")
    return value


def _flag(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise VadSettingsError(key, f"must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class VadSettings:
    """Server-VAD turn detection settings, as in a realtime session's turn_detection.

    With ``end_of_turn`` on, a pause is shown to the end-of-turn model
    (agent/models/end_of_turn.py): at ``end_of_turn_threshold`` or above the turn ends after
    ``end_of_turn_silence_ms`` of silence, else after the full ``silence_duration_ms``.
    """

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "min_speech_ms",
         "min_speech_duration_ms", "create_response", "interrupt_response",
         "end_of_turn", "end_of_turn_threshold", "end_of_turn_silence_ms"}
    )

    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_ms: int = 100
    create_response: bool = True
    interrupt_response: bool = True
    end_of_turn: bool = True
    end_of_turn_threshold: float = 0.5
    end_of_turn_silence_ms: int = 200

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VadSettings:
        """Validate a settings dict; raise VadSettingsError (a ValueError) naming the bad key."""
        if not isinstance(d, dict):
            raise VadSettingsError("turn_detection", f"must be an object, got {d!r}")
        for key in d:
            if key not in cls.KEYS:
                raise VadSettingsError(key, "unknown key")
        kind = d.get("type", "server_vad")
        if kind != "server_vad":
            raise VadSettingsError("type", f"only 'server_vad' is supported, got {kind!r}")
        # vLLM-Omni spells it min_speech_duration_ms; either name, not two different values.
        min_speech = int(_number(d, "min_speech_ms", 100, 0, 5000))
        if "min_speech_duration_ms" in d:
            alias = int(_number(d, "min_speech_duration_ms", 100, 0, 5000))
            if "min_speech_ms" in d and alias != min_speech:
                raise VadSettingsError("min_speech_duration_ms", "differs from min_speech_ms; give one of them")
            min_speech = alias
        silence = int(_number(d, "silence_duration_ms", 500, 0, 10000))
        eot_silence = int(_number(d, "end_of_turn_silence_ms", min(200, silence), 0, 10000))
        if eot_silence > silence:
            raise VadSettingsError("end_of_turn_silence_ms",
                                   f"must not exceed silence_duration_ms ({silence}), got {eot_silence}")
        return cls(
            type=kind,
            threshold=float(_number(d, "threshold", 0.5, 0.0, 1.0)),
            prefix_padding_ms=int(_number(d, "prefix_padding_ms", 300, 0, 5000)),
            silence_duration_ms=silence,
            min_speech_ms=min_speech,
            create_response=_flag(d, "create_response", True),
            interrupt_response=_flag(d, "interrupt_response", True),
            end_of_turn=_flag(d, "end_of_turn", True),
            end_of_turn_threshold=float(_number(d, "end_of_turn_threshold", 0.5, 0.0, 1.0)),
            end_of_turn_silence_ms=eot_silence,
        )

    def stream_settings(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "min_speech_ms": self.min_speech_ms}

    def new_stream(self, model: VadModel, sample_rate: int = VAD_RATE, *,
                   scores_in: SharedScores | None = None) -> VadStream:
        return VadStream(model, sample_rate=sample_rate, scores_in=scores_in, **self.stream_settings())
