"""Silero voice activity detection: a shared ONNX model and cheap per-session streams."""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from duplex_agent.agent.models.model_errors import MissingModelError, require_module
from duplex_agent.agent.models.shared_model import SharedModel

logger = logging.getLogger("duplex_agent.models")

# (package holding the ONNX file, its path inside the package, pip name), in order of preference.
_MODEL_SOURCES = (
    ("livekit.plugins.silero", "resources/silero_vad.onnx", "livekit-plugins-silero"),
    ("silero_vad", "data/silero_vad.onnx", "silero-vad"),
)
_WINDOWS = {16000: 512, 8000: 256}  # samples per model call
_CONTEXTS = {16000: 64, 8000: 32}  # trailing samples of the previous window the model also sees


def _load_model_bytes() -> bytes:
    for package, path, _ in _MODEL_SOURCES:
        # find_spec locates the package without running its __init__ (livekit's imports
        # livekit.agents, ~1.5 s).
        try:
            spec = importlib.util.find_spec(package)
        except ImportError:
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            model = Path(folder, path)
            if model.is_file():
                return model.read_bytes()
    raise MissingModelError("Silero VAD model", _MODEL_SOURCES[0][2])


class SileroVadModel(SharedModel):
    """The Silero VAD v5 ONNX network; stateless, shared by all streams, thread-safe."""


    def __init__(self) -> None:
        ort = require_module("onnxruntime", "onnxruntime")
        start = time.perf_counter()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning threads burn a core between the tiny per-window calls.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            _load_model_bytes(), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        logger.info("Silero VAD loaded in %.2f s", time.perf_counter() - start)

    def infer(
        self, window: np.ndarray, state: np.ndarray, sample_rate: int
    ) -> tuple[float, np.ndarray]:
        """One model call.

        window: float32 of shape (1, context + window samples); state: float32 (2, 1, 128).
        Returns the speech probability and the next state.
        """
        prob, next_state = self._session.run(
            None,
            {"input": window, "state": state, "sr": np.array(sample_rate, dtype=np.int64)},
        )
        return float(prob.item()), next_state


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: float  # position in the stream, ms since its start (or last reset)


class VadStream:
    """Per-session VAD state: buffers audio, runs the shared model per window, emits events.

    speech_started is emitted once min_speech_ms of speech has been seen; its audio_ms is the
    onset of that speech. speech_stopped is emitted once silence_duration_ms of silence has
    followed; its audio_ms is the end of the speech. prefix_padding_ms is kept for the caller,
    which decides how much audio before the onset to include in a turn.
    """

    def __init__(
        self,
        model: SileroVadModel,
        *,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        min_speech_ms: int = 100,
        sample_rate: int = 16000,
    ) -> None:
        if sample_rate not in _WINDOWS:
            raise ValueError(f"sample_rate must be one of {sorted(_WINDOWS)}, got {sample_rate}")
        self._model = model
        self.threshold = threshold
        # Hysteresis as in Silero's reference iterator: speech continues until the
        # probability falls clearly below the onset threshold.
        self.release_threshold = max(threshold - 0.15, 0.01)
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.min_speech_ms = min_speech_ms
        self.sample_rate = sample_rate
        self._window = _WINDOWS[sample_rate]
        self._context = _CONTEXTS[sample_rate]
        self.window_ms = 1000.0 * self._window / sample_rate
        self.reset()

    def reset(self) -> None:
        """Forget all audio and state; positions restart at 0."""
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._input = np.zeros((1, self._context + self._window), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows_done = 0
        self._speaking = False
        self._onset_ms: float | None = None  # candidate onset while not yet speaking
        self._speech_run_ms = 0.0
        self._speech_end_ms = 0.0
        self._silence_run_ms = 0.0
        self.last_probability = 0.0
        self.probabilities: list[float] = []  # one per window of the last push, for metering

    @property
    def speaking(self) -> bool:
        return self._speaking

    @property
    def position_ms(self) -> float:
        """End of the audio analysed so far (buffered remainders excluded)."""
        return self._windows_done * self.window_ms

    def push(self, samples: np.ndarray) -> list[VadEvent]:
        """Consume mono float32 audio at sample_rate, of any length; return new events."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        audio = np.concatenate((self._pending, samples)) if self._pending.size else samples
        n_windows = audio.size // self._window
        self._pending = audio[n_windows * self._window :].copy()
        self.probabilities = []
        events: list[VadEvent] = []
        for i in range(n_windows):
            window = audio[i * self._window : (i + 1) * self._window]
            event = self._step(window)
            if event is not None:
                events.append(event)
        return events

    def _step(self, window: np.ndarray) -> VadEvent | None:
        # The model input is the previous window's tail followed by this window.
        self._input[0, : self._context] = self._input[0, -self._context :]
        self._input[0, self._context :] = window
        prob, self._state = self._model.infer(self._input, self._state, self.sample_rate)
        self.last_probability = prob
        self.probabilities.append(prob)
        start_ms = self._windows_done * self.window_ms
        self._windows_done += 1
        end_ms = start_ms + self.window_ms

        if not self._speaking:
            if prob >= self.threshold:
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
            return None

        if prob >= self.release_threshold:
            self._speech_end_ms = end_ms
            self._silence_run_ms = 0.0
            return None
        self._silence_run_ms += self.window_ms
        if self._silence_run_ms < self.silence_duration_ms:
            return None
        self._speaking = False
        self._onset_ms = None
        self._speech_run_ms = 0.0
        return VadEvent("speech_stopped", self._speech_end_ms)


class VadSettingsError(ValueError):
    """A bad turn-detection setting; `key` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key!r}: {message}")
        self.key = key


def _number(d: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
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
    """Server-VAD turn detection settings, as in a realtime session's turn_detection."""

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "min_speech_ms",
         "create_response", "interrupt_response"}
    )

    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_ms: int = 100
    create_response: bool = True
    interrupt_response: bool = True

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
        return cls(
            type=kind,
            threshold=float(_number(d, "threshold", 0.5, 0.0, 1.0)),
            prefix_padding_ms=int(_number(d, "prefix_padding_ms", 300, 0, 5000)),
            silence_duration_ms=int(_number(d, "silence_duration_ms", 500, 0, 10000)),
            min_speech_ms=int(_number(d, "min_speech_ms", 100, 0, 5000)),
            create_response=_flag(d, "create_response", True),
            interrupt_response=_flag(d, "interrupt_response", True),
        )

    def new_stream(self, model: SileroVadModel, sample_rate: int = 16000) -> VadStream:
        return VadStream(
            model,
            threshold=self.threshold,
            prefix_padding_ms=self.prefix_padding_ms,
            silence_duration_ms=self.silence_duration_ms,
            min_speech_ms=self.min_speech_ms,
            sample_rate=sample_rate,
        )
