"""Caller audio in and agent audio out through livekit's FFI, waking only the call they belong to.

``CallerAudioStream`` and ``AgentVoiceSource`` wrap the SDK's own stream and source; their
events come through the process-wide ``FfiRouter`` (``ffi_router.py``): caller frames by
stream handle, capture acknowledgements by request id. The SDK internals used here are
listed, with the version checked, in ``webrtc.private_internals``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi

from duplex_agent.webrtc.livekit.ffi_router import FfiRouter


class CallerAudioStream:
    """The caller's track as 20 ms mono frames at ``sample_rate``, woken only for its own frames."""

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

    ``capture_frame`` returns once the SDK has taken the frame: with a queue, that paces the
    sender by the queue, as the SDK's own ``capture_frame`` does; unqueued, at once.
    """

    def __init__(self, sample_rate: int, num_channels: int, *, queue_size_ms: int) -> None:
        self._router = FfiRouter.shared()
        self.queue_size_ms = queue_size_ms
        self.source = rtc.AudioSource(sample_rate, num_channels, queue_size_ms=queue_size_ms)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if frame.samples_per_channel == 0 or self.source._ffi_handle.disposed:
            return
        async_id = self._request_capture(frame)
        try:
            done = await self._router.expect_capture(async_id)
        finally:
            self._router.drop_capture(async_id)
        if done.capture_audio_frame.error:
            raise RuntimeError(f"capture_audio_frame: {done.capture_audio_frame.error}")

    def capture_now(self, frame: rtc.AudioFrame) -> None:
        """Hand ``frame`` to the source and wait for no acknowledgement (an error in it is logged):
        the caller paces the frames. An unqueued source (``queue_size_ms=0``) takes only 10 ms
        frames and hands them to WebRTC at once; a queued one takes a frame while it has room."""
        if not self.source._ffi_handle.disposed:
            self._router.leave_capture(self._request_capture(frame))

    async def send_paced(self, next_frame: Callable[[], np.ndarray], playing: Callable[[], bool],
                         wait_for_audio: Callable[[], Awaitable[None]]) -> None:
        """Send ``next_frame()`` (int16 mono) one frame per deadline, start + n x its length on the
        loop's clock (sleeps that run long do not drift), each taken at its deadline and handed to
        the source at once, its acknowledgement waking no loop.

        The source's queue then holds about the frame just sent, so a pause or a clear in the
        playout is heard in the next frame. While ``playing()`` is false nothing is captured (a
        queued native source sends silence by itself) and this waits for the next audio. A loop
        that falls behind by more than a frame starts its schedule again instead of bursting,
        which would put frames ahead in the queue, where a pause no longer reaches them."""
        loop = asyncio.get_running_loop()
        rate = self.source.sample_rate
        part = rate // 100 if self.queue_size_ms == 0 else 1 << 30  # an unqueued source takes 10 ms
        start, frames = loop.time(), 0
        while True:
            pcm = next_frame()
            if not playing():
                await wait_for_audio()
                start, frames = loop.time(), 0
                continue
            for at in range(0, pcm.size, part):
                self.capture_now(rtc.AudioFrame(pcm[at : at + part].tobytes(), rate, 1, min(part, pcm.size - at)))
            frames += 1
            frame_s = pcm.size / rate
            deadline, now = start + frames * frame_s, loop.time()
            if now - deadline > frame_s:
                start, frames = now, 0
            elif deadline > now:
                await asyncio.sleep(deadline - now)

    def _request_capture(self, frame: rtc.AudioFrame) -> int:
        request = proto_ffi.FfiRequest()
        request.capture_audio_frame.source_handle = self.source._ffi_handle.handle
        request.capture_audio_frame.buffer.CopyFrom(frame._proto_info())
        return FfiClient.instance.request(request).capture_audio_frame.async_id

    def clear_queue(self) -> None:
        self.source.clear_queue()

    async def aclose(self) -> None:
        await self.source.aclose()
