"""Real speech for tests: Piper says a sentence, Whisper transcribes what came back."""

from __future__ import annotations

import functools
import re
import wave
from pathlib import Path

import numpy as np
import soxr


@functools.lru_cache(maxsize=32)
def _spoken(text: str, rate: int) -> np.ndarray:
    from duplex_agent.plugins.reference.tts import PiperSynthesizer

    tts = PiperSynthesizer.shared()
    audio = tts.synthesize_all(text)
    return soxr.resample(audio, tts.sample_rate, rate).astype(np.float32)


def speak(text: str, rate: int = 16000, *, before_ms: float = 0.0, after_ms: float = 0.0) -> np.ndarray:
    """Piper's voice saying ``text`` at ``rate``, with silence around it."""
    audio = _spoken(text, rate)
    pad = lambda ms: np.zeros(int(rate * ms / 1000), np.float32)  # noqa: E731
    return np.concatenate([pad(before_ms), audio, pad(after_ms)])


def transcribe(samples: np.ndarray, rate: int) -> str:
    from duplex_agent.plugins.reference.asr import WhisperRecognizer

    audio16k = samples if rate == 16000 else soxr.resample(samples.astype(np.float32), rate, 16000)
    return WhisperRecognizer.shared().transcribe(audio16k.astype(np.float32))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def write_wav(path: Path, audio: np.ndarray, rate: int) -> Path:
    """Mono 16-bit WAV (a fake microphone for Chromium)."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path
