"""Caller audio in and agent audio out through livekit's FFI, waking only the call they belong to.

``CallerAudioStream`` and ``AgentVoiceSource`` wrap the SDK's own stream and source; their
events come through the process-wide ``FfiRouter`` (``ffi_router.py``): caller frames by
stream handle, capture acknowledgements by request id. The SDK internals used here are
listed, with the version checked, in ``webrtc.private_internals``.
"""

from __future__ import annotations

from livekit import rtc
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi

from duplex_agent.webrtc.livekit.ffi_router import FfiRouter


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

    ``capture_frame`` returns once the SDK has taken the frame, which paces the
    sender by the source's short queue, as the SDK's own ``capture_frame`` does.
    """

    def __init__(self, sample_rate: int, num_channels: int, *, queue_size_ms: int) -> None:
        self._router = FfiRouter.shared()
        self.source = rtc.AudioSource(sample_rate, num_channels, queue_size_ms=queue_size_ms)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if frame.samples_per_channel == 0 or self.source._ffi_handle.disposed:
            return
        request = proto_ffi.FfiRequest()
        request.capture_audio_frame.source_handle = self.source._ffi_handle.handle
        request.capture_audio_frame.buffer.CopyFrom(frame._proto_info())
        response = FfiClient.instance.request(request)
        async_id = response.capture_audio_frame.async_id
        try:
            done = await self._router.expect_capture(async_id)
        finally:
            self._router.drop_capture(async_id)
        if done.capture_audio_frame.error:
            raise RuntimeError(f"capture_audio_frame: {done.capture_audio_frame.error}")

    def clear_queue(self) -> None:
        self.source.clear_queue()

    async def aclose(self) -> None:
        await self.source.aclose()
