"""Caller audio in and agent audio out through livekit's FFI, waking only the call they belong to.

``CallerAudioStream`` and ``AgentVoiceSource`` wrap the SDK's own stream and source; their
events come through the process-wide ``FfiRouter`` (``ffi_router.py``): caller frames by
stream handle, capture acknowledgements by request id. The SDK internals used here are
listed, with the version checked, in ``webrtc.private_internals``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi

from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE, PlayoutQueue

#: The native source's clock: each tick sends 10 ms of its queue (or silence when it is empty).
NATIVE_TICK_S = 0.010


class CallerAudioStream:
    """The caller's track as ``frame_size_ms`` mono frames at ``sample_rate``, woken only for its own frames."""

    def __init__(self, track: rtc.Track, sample_rate: int, *, frame_size_ms: int = 20) -> None:
        self._router = FfiRouter.shared()
        self.stream = rtc.AudioStream(track, sample_rate=sample_rate, num_channels=1, frame_size_ms=frame_size_ms)
        self._handle = self.stream._ffi_handle.handle
        self._router.own_stream(self.stream)

    def __aiter__(self) -> CallerAudioStream:
        return self

    async def __anext__(self) -> rtc.AudioFrame:
        event = await self.stream.__anext__()
        return event.frame

    async def aclose(self) -> None:
        try:
            await self.stream.aclose()
        finally:
            self._router.forget_stream(self._handle)


class AgentVoiceSource:
    """An ``rtc.AudioSource`` fed through the router: one wake-up per captured frame, for this call.

    ``capture_frame`` returns once the SDK has taken the frame, which paces the sender by the
    source's short queue, as the SDK's own ``capture_frame`` does. ``held_ms`` is what that
    queue still holds: the native source sends 10 ms from it each 10 ms tick, and takes a frame
    at once when the queue then holds no more than its size, else at the tick that brings it
    down to its size. So it is exact to the tick while frames come back to back, and within one
    tick (10 ms) after a gap.
    """

    def __init__(self, sample_rate: int, num_channels: int, *, queue_size_ms: int) -> None:
        self._router = FfiRouter.shared()
        self.source = rtc.AudioSource(sample_rate, num_channels, queue_size_ms=queue_size_ms)
        self.queue_size_ms = queue_size_ms
        self._held_ms = 0.0  # what the native queue held at ``_held_at`` (monotonic s)
        self._held_at = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if frame.samples_per_channel == 0 or self.source._ffi_handle.disposed:
            return
        asked_at = time.monotonic()
        held = self.held_ms(asked_at) + 1000.0 * frame.samples_per_channel / frame.sample_rate
        request = proto_ffi.FfiRequest()
        request.capture_audio_frame.source_handle = self.source._ffi_handle.handle
        request.capture_audio_frame.buffer.CopyFrom(frame._proto_info())
        response = FfiClient.instance.request(request)
        async_id = response.capture_audio_frame.async_id
        try:
            done = await self._router.expect_capture(async_id)
        finally:
            self._router.drop_capture(async_id)
        if done.event.capture_audio_frame.error:
            raise RuntimeError(f"capture_audio_frame: {done.event.capture_audio_frame.error}")
        if held <= self.queue_size_ms:  # taken at once
            self._held_ms, self._held_at = held, asked_at
        else:  # taken at the tick that left the queue at its size
            self._held_ms, self._held_at = float(self.queue_size_ms), done.arrived_at

    async def play(self, playout: PlayoutQueue, next_frame: Callable[[], np.ndarray]) -> None:
        """Feed the track ``next_frame``'s 20 ms (the playout's 48 kHz mono frames) at a time,
        paced by the queue, until cancelled.

        While the agent is quiet nothing is captured (the native source sends silence by
        itself): the loop waits for the next audio instead of an FFI round trip per frame.
        A pause takes effect at the next frame, as soon as the source has taken the last:
        what the queue still holds (its size then) is dropped and goes back to the playout, whose
        fade-out the source sends next, right after what it sent last; after a resume that
        audio plays from where the caller stopped hearing.
        """
        while True:
            held = self.held_ms()
            if held and playout.take_back(held):
                self.clear_queue()
            pcm = next_frame()
            if not playout.playing:
                await playout.wait_for_audio()
                continue
            await self.capture_frame(rtc.AudioFrame(pcm.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES))

    def held_ms(self, now: float | None = None) -> float:
        """Captured audio the native queue has not sent yet, to its 10 ms tick."""
        ticks = math.floor(((time.monotonic() if now is None else now) - self._held_at) / NATIVE_TICK_S)
        return max(0.0, self._held_ms - 1000.0 * NATIVE_TICK_S * ticks)

    def clear_queue(self) -> None:
        self.source.clear_queue()
        self._held_ms = 0.0

    async def aclose(self) -> None:
        await self.source.aclose()
