"""The livekit FFI audio path (real SDK, no room): each call's loop gets only its own events."""

import asyncio

import numpy as np
import pytest
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient

from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.livekit.room import SOURCE_QUEUE_MS

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


async def test_an_unqueued_source_sends_what_is_captured_and_wakes_no_loop_for_it(caplog):
    """capture_now: 10 ms frames reach the track at once; their acknowledgements are routed to no
    loop and leave nothing waiting; a frame the source refuses is logged, not raised."""
    router = FfiRouter.shared()
    source = AgentVoiceSource(RATE, 1, queue_size_ms=0)
    track = rtc.LocalAudioTrack.create_audio_track("unqueued", source.source)
    stream = CallerAudioStream(track, RATE, frame_size_ms=20)
    seen: list[int] = []

    async def read() -> None:
        async for frame in stream:
            seen.extend(int(v) for v in np.unique(np.frombuffer(frame.data, dtype=np.int16)) if v)
            if seen:
                return

    reader = asyncio.create_task(read())
    routed = router.routed
    loop = asyncio.get_running_loop()
    for _ in range(20):  # 200 ms, in real time
        source.capture_now(rtc.AudioFrame(np.full(480, 1500, dtype=np.int16).tobytes(), RATE, 1, 480))
        await asyncio.sleep(0.01)
    await asyncio.wait_for(reader, 10)
    assert set(seen) == {1500}
    caplog.set_level("WARNING", logger="duplex_agent.livekit")
    source.capture_now(_frame(700))  # 20 ms: an unqueued source takes only 10 ms frames
    deadline = loop.time() + 10
    while not any("capture_audio_frame" in r.getMessage() for r in caplog.records):
        assert loop.time() < deadline, "the refused frame's error was not logged"
        await asyncio.sleep(0.02)
    while router._unawaited:  # the last acknowledgements may still be on their way
        assert loop.time() < deadline, f"acknowledgements left waiting: {router._unawaited}"
        await asyncio.sleep(0.02)
    # Only the stream's own frames were handed to this loop, none of the 21 captures' acknowledgements.
    frames_read = router.routed - routed
    assert frames_read <= 20 and not router._early
    await stream.aclose()
    await source.aclose()


async def test_a_paced_sender_sends_every_frame_in_order_and_nothing_while_quiet():
    """send_paced into the worker's short queue: each frame taken when it is due goes out whole and
    in order (none refused by the queue), and while nothing plays nothing is captured."""
    router = FfiRouter.shared()
    source = AgentVoiceSource(RATE, 1, queue_size_ms=SOURCE_QUEUE_MS)
    track = rtc.LocalAudioTrack.create_audio_track("paced", source.source)
    stream = CallerAudioStream(track, RATE, frame_size_ms=20)
    levels = list(range(100, 3100, 100))  # 30 frames, 600 ms
    taken: list[int] = []
    audio = asyncio.Event()
    audio.set()

    def next_frame() -> np.ndarray:
        level = levels[len(taken)] if len(taken) < len(levels) else 0
        taken.append(level)
        return np.full(960, level, dtype=np.int16)

    def playing() -> bool:
        if len(taken) > len(levels):
            audio.clear()
        return audio.is_set()

    seen: list[int] = []

    async def read() -> None:
        async for frame in stream:
            seen.extend(int(v) for v in np.frombuffer(frame.data, dtype=np.int16) if v)
            if len(seen) >= 960 * len(levels):
                return

    reader = asyncio.create_task(read())
    sender = asyncio.create_task(source.send_paced(next_frame, playing, audio.wait))
    await asyncio.wait_for(reader, 20)
    ordered = [seen[i] for i in range(0, len(seen), 960)]
    assert ordered == levels and len(seen) == 960 * len(levels)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while router._unawaited:  # the last acknowledgements may still be on their way
        assert loop.time() < deadline, f"acknowledgements left waiting: {router._unawaited}"
        await asyncio.sleep(0.02)
    # Quiet: the sender waits for audio; it took one frame to see that, and captures nothing more.
    assert len(taken) == len(levels) + 1 and not sender.done()
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    await stream.aclose()
    await source.aclose()
