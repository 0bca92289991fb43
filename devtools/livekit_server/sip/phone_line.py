"""A telephone line's audio: 8 kHz, 300-3400 Hz, G.711 mu-law (PCMU) on the wire.

What a far end says goes into the room the way LiveKit's SIP bridge would carry it from a
phone: band-limited, sampled at 8 kHz, companded to 8 bits and back, then resampled to the
room's 48 kHz. What the room sends to the phone goes the same way down. Each direction
keeps its own filter and resampler state across frames, so a stream of 20 ms frames comes
out as one continuous signal.
"""

from __future__ import annotations

import numpy as np
import soxr

LINE_RATE = 8000
LOW_HZ = 300.0
HIGH_HZ = 3400.0
#: Taps of the band-pass FIR at 8 kHz: enough for a transition band of roughly 100 Hz,
#: so 300 Hz is already well down and the voice band passes flat.
TAPS = 255
_MU = 255.0


def band_pass_taps(rate: int = LINE_RATE, low_hz: float = LOW_HZ, high_hz: float = HIGH_HZ,
                   taps: int = TAPS) -> np.ndarray:
    """A windowed-sinc band-pass (Blackman): the voice band of a phone line."""
    n = np.arange(taps) - (taps - 1) / 2

    def low_pass(cut_hz: float) -> np.ndarray:
        return 2 * cut_hz / rate * np.sinc(2 * cut_hz / rate * n)

    kernel = (low_pass(high_hz) - low_pass(low_hz)) * np.blackman(taps)
    return kernel.astype(np.float64)


def mu_law_encode(samples: np.ndarray) -> np.ndarray:
    """G.711 mu-law bytes of float samples in [-1, 1] (the continuous mu=255 curve, 8 bits)."""
    x = np.clip(samples.astype(np.float64), -1.0, 1.0)
    y = np.sign(x) * np.log1p(_MU * np.abs(x)) / np.log1p(_MU)
    return np.round((y + 1.0) * 127.5).astype(np.uint8)


def mu_law_decode(codes: np.ndarray) -> np.ndarray:
    y = codes.astype(np.float64) / 127.5 - 1.0
    return (np.sign(y) * np.expm1(np.abs(y) * np.log1p(_MU)) / _MU).astype(np.float32)


class LineDirection:
    """One direction of a line: audio at ``rate`` in, what the other side gets out (at ``out_rate``),
    and the 8 kHz samples that crossed the line (for a test to read)."""

    def __init__(self, rate: int, out_rate: int) -> None:
        self._down = soxr.ResampleStream(rate, LINE_RATE, 1, dtype="float32") if rate != LINE_RATE else None
        self._up = soxr.ResampleStream(LINE_RATE, out_rate, 1, dtype="float32") if out_rate != LINE_RATE else None
        self._kernel = band_pass_taps()
        self._history = np.zeros(TAPS - 1, np.float64)

    def carry(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(what comes out at the far side, the 8 kHz line signal) for ``samples``."""
        narrow = self._down.resample_chunk(samples.astype(np.float32)) if self._down else samples
        padded = np.concatenate([self._history, narrow.astype(np.float64)])
        filtered = np.convolve(padded, self._kernel, mode="valid")
        self._history = padded[len(padded) - (TAPS - 1):]
        line = mu_law_decode(mu_law_encode(filtered))
        out = self._up.resample_chunk(line) if self._up else line
        return out.astype(np.float32), line
