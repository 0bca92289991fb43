"""Test audio: a steady tone at a given rate and level. Speech comes from ``devtools.speech``
(Piper's voice with its prosody sampling off, the same audio in every run)."""

from __future__ import annotations

import numpy as np


def tone(ms: float, hz: float = 440.0, *, rate: int = 16000, level: float = 0.3) -> np.ndarray:
    """``ms`` of a sine at ``hz`` and peak ``level``, float32 at ``rate``."""
    t = np.arange(int(rate * ms / 1000)) / rate
    return (level * np.sin(2 * np.pi * hz * t)).astype(np.float32)
