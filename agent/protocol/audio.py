"""Audio at the edges of the runtime: wire codecs and streaming resampling.

Inside, audio is float32 mono in [-1, 1]; at the edges it is int16 or float32
little-endian bytes, base64 on JSON wires. Rates always travel with the audio.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

from duplex_agent.agent.protocol.events import ProtocolError

INPUT_FORMATS = {"pcm16": 2, "pcm_f32le": 4}
#: Rates a client may declare for its input audio.
SUPPORTED_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})


def decode_base64_audio(text: str, audio_format: str) -> np.ndarray:
    """Wire audio to float32 samples; ProtocolError with a distinct code when bad."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio_base64", "audio is not valid base64") from None
    return decode_pcm(raw, audio_format)


def decode_pcm(raw: bytes, audio_format: str) -> np.ndarray:
    width = INPUT_FORMATS.get(audio_format)
    if width is None:
        raise ProtocolError("unsupported_audio_format", f"unsupported audio format {audio_format!r}")
    if len(raw) % width:
        raise ProtocolError("invalid_audio_length", f"{len(raw)} bytes is not a whole number of {audio_format} samples")
    if audio_format == "pcm16":
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    samples = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(samples)):
        raise ProtocolError("invalid_audio_samples", "pcm_f32le audio holds NaN or infinite samples")
    return np.clip(samples, -1.0, 1.0)


def to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def encode_base64_pcm16(samples: np.ndarray) -> str:
    return base64.b64encode(to_pcm16(samples)).decode("ascii")


def encode_base64_f32(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<f4").tobytes()).decode("ascii")


def encode_base64_audio(samples: np.ndarray, audio_format: str) -> str:
    """float32 samples -> base64 ``audio_format`` (pcm16 or pcm_f32le)."""
    if audio_format == "pcm_f32le":
        return encode_base64_f32(samples)
    if audio_format == "pcm16":
        return encode_base64_pcm16(samples)
    raise ValueError(f"unsupported audio format {audio_format!r}")


class StreamingResampler:
    """Resamples a stream chunk by chunk, keeping the filter state across chunks.

    soxr's "LQ" keeps an anti-aliasing filter and holds back at most one 20 ms chunk;
    "HQ" holds back 20-33 ms, too much for a conversation.
    """

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "LQ") -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)

    def process(self, samples: np.ndarray) -> np.ndarray:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        return self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)


def as_float32_audio(audio: object, sample_rate: int, response_format: str, speed: float | None) -> np.ndarray | None:
    """The ``EncodeAudio`` the runtime hands to plugins: audio stays float32 numpy inside the
    process (the wire codec encodes it at the edge); None for an empty chunk."""
    del sample_rate, response_format, speed
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    return samples if samples.size else None
