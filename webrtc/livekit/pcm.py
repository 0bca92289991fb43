"""A livekit audio frame as the call path's input: float32 mono samples."""

from __future__ import annotations

import numpy as np
from livekit import rtc


def frame_samples(frame: rtc.AudioFrame) -> np.ndarray:
    """The frame's int16 PCM as float32 in [-1, 1), its channels averaged to one."""
    samples = np.frombuffer(frame.data, dtype=np.int16).astype(np.float32) * np.float32(1.0 / 32768.0)
    if frame.num_channels > 1:
        samples = samples.reshape(-1, frame.num_channels).mean(axis=1)
    return samples
