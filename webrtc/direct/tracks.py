"""aiortc media glue: a paced outgoing track and a reader for the caller's track."""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

logger = logging.getLogger("duplex_agent.webrtc")

_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
#: Further behind than this (a stalled loop), the schedule restarts instead of bursting.
_MAX_LAG_S = 0.2


class PlayoutTrack(MediaStreamTrack):
    """Sends one 20 ms frame from ``next_frame`` per deadline, s16 mono 48 kHz.

    Deadlines are start + n * 20 ms on the monotonic clock, so sleeps that run
    long do not accumulate drift. The frame is taken at its deadline, so a
    playout clear is heard in the very next frame.
    """

    kind = "audio"

    def __init__(self, next_frame: Callable[[], np.ndarray]) -> None:
        super().__init__()
        self._next_frame = next_frame
        self._start: float | None = None
        self._frames = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._frames += 1
            deadline = self._start + self._frames * _FRAME_S
            if now - deadline > _MAX_LAG_S:
                self._start = now - self._frames * _FRAME_S
            elif deadline > now:
                await asyncio.sleep(deadline - now)
        samples = self._next_frame()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = _TIME_BASE
        return frame


def frame_to_mono_f32(frame: av.AudioFrame) -> np.ndarray:
    """A decoded audio frame (s16 or flt, packed or planar, any channels) as mono float32."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        data = data.reshape(channels, -1).T
    else:
        data = data.reshape(-1, channels)
    if data.dtype == np.int16:
        data = data.astype(np.float32) / 32768.0
    else:
        data = data.astype(np.float32)
    return data.mean(axis=1) if channels > 1 else data[:, 0]


class CallerAudioReader:
    """Owns the task that pulls the caller's frames and hands them on as mono float32."""

    def __init__(
        self,
        track: MediaStreamTrack,
        sink: Callable[[np.ndarray, int], None],
        *,
        on_ended: Callable[[], None] | None = None,
    ) -> None:
        self._track = track
        self._sink = sink
        self._on_ended = on_ended
        self._task = asyncio.create_task(self._run(), name="caller-audio-reader")

    async def _run(self) -> None:
        try:
            while True:
                frame = await self._track.recv()
                self._sink(frame_to_mono_f32(frame), frame.sample_rate)
        except MediaStreamError:
            logger.debug("caller track ended")
        except Exception:
            logger.exception("caller audio reader failed")
        if self._on_ended is not None:
            self._on_ended()

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
