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

#: Input formats -> bytes per sample. G.711 (8-bit mu-law / A-law) is the telephone's.
INPUT_FORMATS = {"pcm16": 2, "pcm_f32le": 4, "g711_ulaw": 1, "g711_alaw": 1}
#: Rates a client may declare for its input audio.
SUPPORTED_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
#: The spellings vLLM-Omni accepts for each format (beta names, GA ``audio/...`` MIME types, aliases).
_FORMAT_ALIASES = {
    "pcm16": "pcm16", "pcm_s16le": "pcm16", "s16le": "pcm16", "pcm": "pcm16", "audio/pcm": "pcm16",
    "audio/pcm16": "pcm16",
    "pcm_f32le": "pcm_f32le", "f32le": "pcm_f32le", "audio/pcm_f32le": "pcm_f32le",
    "g711_ulaw": "g711_ulaw", "g711-ulaw": "g711_ulaw", "ulaw": "g711_ulaw", "mulaw": "g711_ulaw",
    "audio/g711_ulaw": "g711_ulaw",
    "g711_alaw": "g711_alaw", "g711-alaw": "g711_alaw", "alaw": "g711_alaw", "audio/g711_alaw": "g711_alaw",
}
#: Our format names as GA ``audio.*.format.type`` MIME types.
FORMAT_MIME = {"pcm16": "audio/pcm", "pcm_f32le": "audio/pcm_f32le", "g711_ulaw": "audio/g711_ulaw",
               "g711_alaw": "audio/g711_alaw"}


def parse_audio_format(declared: object) -> tuple[str | None, int | None]:
    """A declared wire format (a name or a GA ``{"type", "rate"}`` object) -> (our format name, rate).

    The name is None when the declaration names no format we can decode; the rate is None when it gives none.
    """
    rate: int | None = None
    if isinstance(declared, dict):
        raw_rate = declared.get("rate", declared.get("sample_rate_hz", declared.get("sample_rate")))
        if isinstance(raw_rate, int | float) and not isinstance(raw_rate, bool) and raw_rate > 0:
            rate = int(raw_rate)
        declared = declared.get("type", declared.get("format"))
    if not isinstance(declared, str):
        return None, rate
    return _FORMAT_ALIASES.get(declared.lower()), rate


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
    if audio_format == "g711_ulaw":
        return _ULAW[np.frombuffer(raw, dtype=np.uint8)]
    if audio_format == "g711_alaw":
        return _ALAW[np.frombuffer(raw, dtype=np.uint8)]
    samples = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(samples)):
        raise ProtocolError("invalid_audio_samples", "pcm_f32le audio holds NaN or infinite samples")
    return np.clip(samples, -1.0, 1.0)


def _ulaw_table() -> np.ndarray:
    """G.711 mu-law byte -> float32 sample (ITU-T G.711: complement, then sign, exponent, mantissa)."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = ((((code & 0x0F) << 3) + 0x84) << ((code >> 4) & 0x07)) - 0x84
    return (np.where(code & 0x80, -magnitude, magnitude) / 32768.0).astype(np.float32)


def _alaw_table() -> np.ndarray:
    """G.711 A-law byte -> float32 sample (even bits inverted, then sign, exponent, mantissa)."""
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return (np.where(code & 0x80, magnitude, -magnitude) / 32768.0).astype(np.float32)


_ULAW = _ulaw_table()
_ALAW = _alaw_table()


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
