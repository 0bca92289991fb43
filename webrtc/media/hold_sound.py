"""The soft sound a caller hears while a tool works: no dead air on a long lookup.

Two quiet, rounded notes every two seconds, well below speech level (a speaker's voice peaks
near full scale; these peak at -24 dBFS), so that they read as "still here" rather than as a
reply. The call path plays it only where the agent is silent, so it never covers the agent's
words, and the edge runner starts and stops it (quiet while the caller speaks, off when the
answer's audio starts).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

PERIOD_S = 2.0
PEAK = 10 ** (-24 / 20)
#: (start in s, frequency in Hz): a rising fifth, A4 then E5.
NOTES = ((0.0, 440.0), (0.22, 659.25))
NOTE_S = 0.35


@cache
def hold_pattern() -> np.ndarray:
    """One period of the sound, int16 at 48 kHz."""
    pattern = np.zeros(int(PERIOD_S * SAMPLE_RATE), np.float32)
    t = np.arange(int(NOTE_S * SAMPLE_RATE), dtype=np.float32) / SAMPLE_RATE
    # A short rise and an exponential fall (a struck, soft note); a little of the octave for warmth.
    envelope = np.minimum(t / 0.015, 1.0) * np.exp(-t / 0.09)
    for start_s, frequency in NOTES:
        note = (np.sin(2 * np.pi * frequency * t) + 0.25 * np.sin(4 * np.pi * frequency * t)) * envelope
        start = int(start_s * SAMPLE_RATE)
        pattern[start:start + note.size] += note[: pattern.size - start]
    pattern *= PEAK / max(float(np.abs(pattern).max()), 1e-9)
    return (pattern * 32767.0).astype(np.int16)


class HoldSound:
    """Start, stop, and the next 20 ms while sounding. ``on_start`` wakes a transport that only
    reads frames while there is audio to send."""

    def __init__(self, on_start: Callable[[], None] | None = None) -> None:
        self._pattern = hold_pattern()
        self._position = 0
        self._on_start = on_start
        self.sounding = False

    def start(self) -> None:
        if self.sounding:
            return
        self.sounding = True
        self._position = 0
        if self._on_start is not None:
            self._on_start()

    def stop(self) -> None:
        self.sounding = False

    def next_frame(self) -> np.ndarray:
        start = self._position
        indices = (np.arange(FRAME_SAMPLES) + start) % self._pattern.size
        self._position = (start + FRAME_SAMPLES) % self._pattern.size
        return self._pattern[indices]
