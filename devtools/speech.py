"""Real speech for tests: Piper (or espeak-ng) says a sentence, Whisper transcribes what came back."""

from __future__ import annotations

import functools
import io
import re
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import soxr


@functools.lru_cache(maxsize=32)
def _spoken(text: str, rate: int) -> np.ndarray:
    from duplex_agent.plugins.reference.tts import PiperSynthesizer

    tts = PiperSynthesizer.shared()
    audio = tts.synthesize_all(text, varied=False)
    return soxr.resample(audio, tts.sample_rate, rate).astype(np.float32)


def speak(text: str, rate: int = 16000, *, before_ms: float = 0.0, after_ms: float = 0.0) -> np.ndarray:
    """Piper's voice saying ``text`` at ``rate``, with silence around it: the same audio in every
    run (Piper's prosody sampling is off), so a test's speech does not change between runs."""
    audio = _spoken(text, rate)
    pad = lambda ms: np.zeros(int(rate * ms / 1000), np.float32)  # noqa: E731
    return np.concatenate([pad(before_ms), audio, pad(after_ms)])


def vocal_burst(ms: float, rate: int = 48000) -> np.ndarray:
    """A voiced grunt or throat-clear: the first ``ms`` of Piper's "ah", edges softened. At 48 ms,
    one or two Silero windows over the threshold as PCM, never the four of the minimum speech;
    through Opus its ring-down scores as speech too, 40-60 dB down (``SPEECH_LEVEL_SPAN_DB``)."""
    ah = speak("ah", rate)
    start = int(np.flatnonzero(np.abs(ah) > 0.02)[0])
    n = int(rate * ms / 1000)
    return (ah[start : start + n] * np.hanning(n) ** 0.3).astype(np.float32)


def espeak(text: str, rate: int = 16000, *, voice: str = "en-us") -> np.ndarray:
    """espeak-ng's ``voice`` (e.g. "en-us", "en-gb+f3") saying ``text`` at ``rate``, trimmed
    to the speech (espeak pads with silence). Needs the espeak-ng program (Debian package)."""
    if shutil.which("espeak-ng") is None:
        raise FileNotFoundError("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True).stdout
    with wave.open(io.BytesIO(wav)) as audio:
        source_rate = audio.getframerate()
        samples = np.frombuffer(audio.readframes(audio.getnframes()), "<i2").astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(samples) > 0.01)
    samples = samples[loud[0] : loud[-1] + 1] if loud.size else samples
    return soxr.resample(samples, source_rate, rate).astype(np.float32)


def pause_inside(audio: np.ndarray, rate: int, at: float, pause_ms: float) -> np.ndarray:
    """``audio`` with ``pause_ms`` of silence inserted at the quietest 10 ms near fraction ``at``
    of it (a gap between words), so the words before the pause keep the prosody of a sentence
    that goes on; synthesising the two halves apart would make the first sound finished."""
    frame = rate // 100
    frames = audio[: audio.size // frame * frame].reshape(-1, frame)
    energy = np.sqrt(np.mean(frames**2, axis=1))
    centre, reach = int(at * len(frames)), max(1, len(frames) // 8)
    lo, hi = max(1, centre - reach), min(len(frames) - 1, centre + reach)
    cut = (lo + int(np.argmin(energy[lo:hi]))) * frame
    return np.concatenate([audio[:cut], np.zeros(int(rate * pause_ms / 1000), np.float32), audio[cut:]])


def phone_line(audio: np.ndarray, rate: int, *, snr_db: float = 20.0, seed: int = 0) -> np.ndarray:
    """``audio`` as a narrowband phone call carries it: hiss ``snr_db`` below the speech, the
    300-3400 Hz band, G.711 mu-law at 8 kHz, then back at ``rate``. The same ``seed`` gives the
    same hiss, so a clip set is the same in every run."""
    line_rate = 8000
    narrow = soxr.resample(audio.astype(np.float32), rate, line_rate).astype(np.float64)
    frame = line_rate // 100
    frames = narrow[: narrow.size // frame * frame].reshape(-1, frame)
    energy = np.sqrt(np.mean(frames**2, axis=1)) if frames.size else np.zeros(1)
    speech_rms = float(np.sqrt(np.mean(energy[energy > 0.01] ** 2))) if np.any(energy > 0.01) else 0.0
    hiss = np.random.default_rng(seed).standard_normal(narrow.size) * speech_rms * 10 ** (-snr_db / 20)
    spectrum = np.fft.rfft(narrow + hiss)
    freqs = np.fft.rfftfreq(narrow.size, 1 / line_rate)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    banded = np.clip(np.fft.irfft(spectrum, narrow.size), -1, 1)
    mu = 255.0  # G.711: 8-bit codes on a logarithmic scale
    codes = np.round(np.sign(banded) * np.log1p(mu * np.abs(banded)) / np.log1p(mu) * 127) / 127
    decoded = np.sign(codes) * np.expm1(np.abs(codes) * np.log1p(mu)) / mu
    return soxr.resample(decoded.astype(np.float32), line_rate, rate).astype(np.float32)


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
