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
from duplex_agent.webrtc.media.playout import FRAME_MS, SAMPLE_RATE, PlayoutQueue

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
        self._clears = 0  # queue clears so far: one during a capture's wait voids its bookkeeping

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if frame.samples_per_channel == 0 or self.source._ffi_handle.disposed:
            return
        asked_at = time.monotonic()
        frame_ms = 1000.0 * frame.samples_per_channel / frame.sample_rate
        held = self.held_ms(asked_at) + frame_ms
        request = proto_ffi.FfiRequest()
        request.capture_audio_frame.source_handle = self.source._ffi_handle.handle
        request.capture_audio_frame.buffer.CopyFrom(frame._proto_info())
        response = FfiClient.instance.request(request)
        async_id = response.capture_audio_frame.async_id
        # The native queue holds the frame from the request on (the acknowledgement only says it
        # is back down to its size): a pause during the wait gives it back too.
        if held > frame_ms:  # on the queue's own ticks
            self._held_ms += frame_ms
        else:
            self._held_ms, self._held_at = held, asked_at
        clears = self._clears
        try:
            done = await self._router.expect_capture(async_id)
        finally:
            self._router.drop_capture(async_id)
        if done.event.capture_audio_frame.error:
            raise RuntimeError(f"capture_audio_frame: {done.event.capture_audio_frame.error}")
        if clears != self._clears:  # emptied while waiting, this frame with the rest
            return
        if held <= self.queue_size_ms:  # taken at once
            self._held_ms, self._held_at = held, asked_at
        else:  # taken at the tick that left the queue at its size
            self._held_ms, self._held_at = float(self.queue_size_ms), done.arrived_at

    async def play(self, playout: PlayoutQueue, next_frame: Callable[[], np.ndarray], *,
                   frames_per_capture: int = 1, sounding: Callable[[], bool] | None = None) -> None:
        """Feed the track ``next_frame``'s 20 ms (the playout's 48 kHz mono frames), up to
        ``frames_per_capture`` of them at a time while that much is queued, paced by the queue,
        until cancelled. Each capture is an FFI round trip that wakes the loop.

        While the agent is quiet nothing is captured (the native source sends silence by
        itself): the loop waits for the next audio instead of an FFI round trip per frame.
        A pause the call path asks takes effect at once (``take_back``, its ``on_paused``); one
        asked elsewhere, at the next capture. ``sounding``: the call path has a sound of its own to
        send while the playout is quiet (the hold sound; it wakes the playout when it starts).
        """
        while True:
            self.take_back(playout)
            pcm = next_frame()
            if not playout.playing and not (sounding is not None and sounding()):
                await playout.wait_for_audio()
                continue
            frames = [pcm]
            while len(frames) < frames_per_capture and playout.queued_ms >= FRAME_MS and not playout.paused:
                frames.append(next_frame())
            pcm = frames[0] if len(frames) == 1 else np.concatenate(frames)
            await self.capture_frame(rtc.AudioFrame(pcm.tobytes(), SAMPLE_RATE, 1, pcm.size))

    def take_back(self, playout: PlayoutQueue) -> float:
        """The playout just paused: drop what the queue still holds, the frame a capture waits
        on included, and give it back to the playout. The source's next tick sends nothing of
        it; the playout's fade-out, captured as soon as the source takes a frame again, goes out
        right after what was heard, and after a resume that audio plays from there. Nothing is
        done where the playout cannot take it back (no pause, or a frame went out since).
        Returns the ms given back (0 where nothing was): the queue drains by the native tick,
        so what it held a moment before may be a tick more."""
        held = self.held_ms()
        if held and playout.take_back(held):
            self.clear_queue()
            return held
        return 0.0

    def held_ms(self, now: float | None = None) -> float:
        """Captured audio the native queue has not sent yet, to its 10 ms tick."""
        ticks = math.floor(((time.monotonic() if now is None else now) - self._held_at) / NATIVE_TICK_S)
        return max(0.0, self._held_ms - 1000.0 * NATIVE_TICK_S * ticks)

    def clear_queue(self) -> None:
        self.source.clear_queue()
        self._held_ms = 0.0
        self._clears += 1

    async def aclose(self) -> None:
        await self.source.aclose()
