"""Caller audio in and agent audio out through livekit's FFI, waking only the call they belong to.

The livekit SDK (1.1) hands every FFI event of the process to every listener. An
``AudioStream`` listens for every stream's audio events and keeps its own, so each
call's loop wakes for every other call's frames; ``AudioSource.capture_frame``
subscribes with no filter for each 20 ms frame it sends, so every capture in flight
wakes for every event. With N calls in one process (jobs are threads of one worker)
that is N x N wake-ups per frame period, and the worker's CPU per call grows with N.

Here one process-wide listener (``FfiAudioRouter``) reads each FFI event once on the
SDK's callback thread and hands the audio events it knows on to the one loop that
waits for them: caller frames by stream handle, capture acknowledgements by request
id. Its filter hook returns False for everything, so the SDK queues nothing for it.
The streams and sources themselves are the SDK's own; only how their events reach
us changes. This leans on the pinned SDK's internals (``AudioStream._ffi_queue``,
``AudioFrame._proto_info``, the FFI queue's lock), which tests/webrtc/test_livekit_audio.py checks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from livekit import rtc
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi
from livekit.rtc._utils import Queue

log = logging.getLogger("duplex_agent.livekit")

#: Capture acknowledgements that came before their request returned, kept until claimed.
_EARLY_KEPT = 256


class FfiAudioRouter:
    """Routes audio-stream events by stream handle and capture callbacks by request id."""

    _instance: FfiAudioRouter | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, Queue[Any]]] = {}
        self._captures: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._early: OrderedDict[int, Any] = OrderedDict()
        self.routed = 0  # events handed to a loop (for tests and benchmarks)
        # The SDK would use this loop only for events the filter lets through: none.
        self._unused_loop = asyncio.new_event_loop()
        FfiClient.instance.queue.subscribe(self._unused_loop, filter_fn=self._route)

    @classmethod
    def shared(cls) -> FfiAudioRouter:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    # ---- on the SDK's callback thread ----

    def _route(self, event: proto_ffi.FfiEvent) -> bool:
        try:
            kind = event.WhichOneof("message")
            if kind == "audio_stream_event":
                with self._lock:
                    target = self._streams.get(event.audio_stream_event.stream_handle)
                if target is not None:
                    target[0].call_soon_threadsafe(target[1].put_nowait, event)
                    self.routed += 1
            elif kind == "capture_audio_frame":
                async_id = event.capture_audio_frame.async_id
                with self._lock:
                    waiter = self._captures.pop(async_id, None)
                    if waiter is None:
                        self._early[async_id] = event
                        while len(self._early) > _EARLY_KEPT:
                            self._early.popitem(last=False)
                if waiter is not None:
                    waiter[0].call_soon_threadsafe(_resolve, waiter[1], event)
                    self.routed += 1
        except Exception:  # never let the SDK deliver an event to our unused loop
            log.exception("routing an FFI event failed")
        return False

    # ---- from the calls' loops ----

    def own_stream(self, stream: rtc.AudioStream) -> None:
        """Let ``stream`` receive only its own events, through this router."""
        loop = stream._loop
        queue: Queue[Any] = Queue()
        old, stream._ffi_queue = stream._ffi_queue, queue
        # Switch over under the SDK's dispatch lock (taken before ours, as its callback thread
        # does): every event then reaches exactly one of the two queues, none is lost or doubled
        # (a frame seen twice would free its native buffer twice).
        with FfiClient.instance.queue._lock:
            FfiClient.instance.queue.unsubscribe(old)
            with self._lock:
                self._streams[stream._ffi_handle.handle] = (loop, queue)

        # Events the SDK put on the old queue before it was unsubscribed are already
        # scheduled on this loop; move them over once they have landed.
        def move() -> None:
            while not old.empty():
                queue.put_nowait(old.get_nowait())

        loop.call_soon(move)

    def forget_stream(self, handle: int) -> None:
        with self._lock:
            self._streams.pop(handle, None)

    def expect_capture(self, async_id: int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            early = self._early.pop(async_id, None)
            if early is None:
                self._captures[async_id] = (loop, future)
        if early is not None:
            future.set_result(early)
        return future

    def drop_capture(self, async_id: int) -> None:
        with self._lock:
            self._captures.pop(async_id, None)


def _resolve(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)


class CallerAudioStream:
    """The caller's track as 20 ms mono frames at ``sample_rate``, woken only for its own frames."""

    def __init__(self, track: rtc.Track, sample_rate: int, *, frame_size_ms: int = 20) -> None:
        self._router = FfiAudioRouter.shared()
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
        self._router = FfiAudioRouter.shared()
        self.source = rtc.AudioSource(sample_rate, num_channels, queue_size_ms=queue_size_ms)
        self._sample_rate = sample_rate
        self._queued_until = 0.0  # monotonic time at which everything captured has played

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
        now = time.monotonic()
        self._queued_until = max(now, self._queued_until) + frame.samples_per_channel / self._sample_rate

    def clear_queue(self) -> None:
        self.source.clear_queue()
        self._queued_until = 0.0

    async def wait_for_playout(self) -> None:
        """Until the audio captured so far has played out of the source's queue."""
        while (left := self._queued_until - time.monotonic()) > 0:
            await asyncio.sleep(left)

    async def aclose(self) -> None:
        await self.source.aclose()
