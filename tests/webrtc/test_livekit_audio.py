"""The livekit FFI audio path (real SDK, no room): each call's loop gets only its own events."""

import asyncio

import numpy as np
import pytest
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient

from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

pytestmark = pytest.mark.asyncio

RATE = 48000


def _frame(level: int) -> rtc.AudioFrame:
    pcm = np.full(960, level, dtype=np.int16)
    return rtc.AudioFrame(pcm.tobytes(), RATE, 1, 960)


async def _loop_through(level: int, frames: int) -> tuple[list[int], int]:
    """Capture ``frames`` constant frames into a source and read its track back: the levels seen."""
    source = AgentVoiceSource(RATE, 1, queue_size_ms=60)
    track = rtc.LocalAudioTrack.create_audio_track(f"level-{level}", source.source)
    stream = CallerAudioStream(track, RATE, frame_size_ms=20)
    seen: list[int] = []
    sizes: set[int] = set()

    async def read() -> None:
        async for frame in stream:
            samples = np.frombuffer(frame.data, dtype=np.int16)
            sizes.add(samples.size)
            seen.extend(int(v) for v in np.unique(samples) if v)
            if len(seen) >= frames // 2:
                return

    reader = asyncio.create_task(read())
    for _ in range(frames):
        await source.capture_frame(_frame(level))
    await asyncio.wait_for(reader, 10)
    await stream.aclose()
    await source.aclose()
    return seen, max(sizes)


async def test_two_calls_each_hear_only_their_own_audio_with_one_listener_for_the_process():
    subscribers = len(FfiClient.instance.queue._subscribers)
    router = FfiRouter.shared()
    routed = router.routed
    (one, size), (two, _) = await asyncio.gather(_loop_through(1000, 60), _loop_through(2000, 60))
    assert set(one) == {1000} and set(two) == {2000}
    assert size == 960  # 20 ms frames at 48 kHz
    assert router.routed - routed >= 2 * (60 + 30)  # captures acknowledged + frames delivered, via the router
    # No listener is left behind, and none was added per frame or per stream.
    assert len(FfiClient.instance.queue._subscribers) <= max(subscribers, 1)


async def test_the_router_delivers_nothing_through_the_sdk_queue():
    router = FfiRouter.shared()
    from livekit.rtc._proto import ffi_pb2

    foreign = ffi_pb2.FfiEvent()
    foreign.audio_stream_event.stream_handle = 987654321  # no stream of ours
    assert router._route(foreign) is False
    early = ffi_pb2.FfiEvent()
    early.capture_audio_frame.async_id = 424242  # an acknowledgement before its request returned
    assert router._route(early) is False
    done = await asyncio.wait_for(router.expect_capture(424242), 1)
    assert done.capture_audio_frame.async_id == 424242
