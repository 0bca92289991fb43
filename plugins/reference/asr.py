"""Speech recognition with faster-whisper tiny.en (CTranslate2, int8, one CPU thread)."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import ClassVar

import numpy as np

from agent.model_errors import require_module
from plugins.reference.weights import whisper_tiny_en_dir

logger = logging.getLogger("duplex_agent.models")

# Loudest 30 ms frame below this (-80 dBFS): digital silence, the model is not run.
_SILENT_RMS = 1e-4
# Loudest 30 ms frame below this (-40 dBFS): too quiet to be speech addressed to us, so
# Whisper's stock phrases for silence and noise are dropped.
_QUIET_RMS = 0.01
_HALLUCINATIONS = frozenset(
    {"", "you", "thank you", "thanks", "thank you very much", "thanks for watching",
     "thank you for watching", "thank you so much for watching", "please subscribe",
     "bye", "so", "oh", "okay", "the end"}
)


def _loudest_frame_rms(samples: np.ndarray, frame: int = 480) -> float:
    n = samples.size // frame
    if n == 0:
        return float(np.sqrt(np.mean(np.square(samples)))) if samples.size else 0.0
    frames = samples[: n * frame].reshape(n, frame)
    return float(np.sqrt(np.mean(np.square(frames), axis=1)).max())


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


class WhisperRecognizer:
    """Shared Whisper tiny.en; `transcribe` is synchronous and safe to call from many threads."""

    sample_rate: ClassVar[int] = 16000
    _shared: ClassVar[WhisperRecognizer | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        fw = require_module("faster_whisper", "faster-whisper")
        path = whisper_tiny_en_dir()
        logger.info("loading Whisper tiny.en from %s", path)
        start = time.perf_counter()
        # CTranslate2 serialises calls on its single worker, so no lock is needed here.
        self._model = fw.WhisperModel(
            str(path), device="cpu", compute_type="int8", cpu_threads=1, local_files_only=True
        )
        logger.info("Whisper tiny.en loaded in %.2f s", time.perf_counter() - start)

    @classmethod
    def shared(cls) -> WhisperRecognizer:
        """The process-wide instance, loaded on first use."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def transcribe(self, samples16k: np.ndarray) -> str:
        """Text of a mono float32 utterance at 16 kHz; "" for silence."""
        samples = np.asarray(samples16k, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        loudness = _loudest_frame_rms(samples)
        if loudness < _SILENT_RMS:
            return ""
        segments, _ = self._model.transcribe(
            samples,
            language="en",
            beam_size=1,
            without_timestamps=True,
            vad_filter=False,
            condition_on_previous_text=False,
        )
        text = " ".join(segment.text.strip() for segment in segments).strip()
        if loudness < _QUIET_RMS and _normalise(text) in _HALLUCINATIONS:
            return ""
        return text
