"""The livekit FFI audio path (real SDK, no room): each call's loop gets only its own events."""

import asyncio

import numpy as np
import pytest
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient

from devtools.voice_loopback import cancel, looped_back
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.media.playout import FADE_SAMPLES, PlaybackFinished, PlayoutQueue

pytestmark = pytest.mark.asyncio

RATE = 48000


def _frame(level: int) -> rtc.AudioFrame:
    pcm = np.full(960, level, dtype=np.int16)
    return rtc.AudioFrame(pcm.tobytes(), RATE, 1, 960)


async def _loop_through(level: int, frames: int) -> tuple[list[int], int]:
    """Capture ``frames`` constant frames into a source and read its track back: the levels seen."""
    seen: list[int] = []
    sizes: set[int] = set()
    async with looped_back(f"level-{level}", queue_size_ms=60, frame_size_ms=20) as (source, stream):

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
    assert done.event.capture_audio_frame.async_id == 424242


# ---- a pause through the real native source: its queue's audio goes back to the playout ----

CODE_BASE, CODE_SPAN = 1000, 16000  # sample i of the reply is int16 CODE_BASE + i % CODE_SPAN


def _coded_reply(samples: int) -> np.ndarray:
    return ((CODE_BASE + np.arange(samples) % CODE_SPAN) / 32767.0).astype(np.float32)


def _full_indices(heard: np.ndarray) -> list[int]:
    """Reply sample indices heard at full level, in order: a sample counts when it is the code
    that follows its neighbour's (fades and silence are not), placed nearest the one before."""
    codes = heard.astype(np.int64) - CODE_BASE
    follows = (np.diff(codes) % CODE_SPAN == 1) & (codes[1:] >= 0) & (codes[:-1] >= 0)
    full = np.zeros(codes.size, bool)
    full[1:] |= follows
    full[:-1] |= follows
    indices: list[int] = []
    for code in codes[full]:
        if not indices:
            indices.append(int(code))
            continue
        step = (int(code) - indices[-1] - 1 + CODE_SPAN // 2) % CODE_SPAN - CODE_SPAN // 2
        indices.append(indices[-1] + 1 + step)
    return indices


REPLY = 48000  # 1 s of coded reply


async def _paused_and_resumed(name: str, *, frames_per_capture: int = 1, pause_at_frames_out: int | None = None,
                              pause_at_loud_heard: int | None = None
                              ) -> tuple[list[np.ndarray], list[PlaybackFinished], dict[str, float]]:
    """Play the coded reply through a real source and its track, pause it (in the sender's
    ``next_frame`` once it has handed ``pause_at_frames_out`` frames, or from the reader's task,
    as the call path's ``on_paused`` does, once it has heard ``pause_at_loud_heard`` loud frames),
    resume once 5 silent frames were heard, and read to the end: what was heard, the finished
    reports, and the figures at the pause (``played_in_gap``: the ledger while the gap was heard)."""
    playout = PlayoutQueue()
    playout.capture(_coded_reply(REPLY), "r1")
    playout.flush("r1")
    heard: list[np.ndarray] = []
    loud_frames = silent_run = 0
    asked: dict[str, float] = {}
    gap_seen = asyncio.Event()
    finished: list[PlaybackFinished] = []

    def next_frame() -> np.ndarray:
        frame = playout.next_frame()
        finished.extend(p for p in playout.take_progress() if isinstance(p, PlaybackFinished))
        if playout.frames_out == pause_at_frames_out:
            assert playout.pause()
        return frame

    async with looped_back(name, queue_size_ms=40) as (source, stream):

        async def read() -> None:
            nonlocal loud_frames, silent_run
            async for frame in stream:
                samples = np.frombuffer(frame.data, dtype=np.int16)
                heard.append(samples)
                loud_frames += bool(samples.any())
                silent_run = 0 if samples.any() else silent_run + 1
                if loud_frames == pause_at_loud_heard and not asked:  # the reader's moment, not the sender's
                    handed_ms = 20.0 * playout.frames_out
                    assert playout.pause()
                    held = source.take_back(playout)
                    asked.update(handed_ms=handed_ms, held=held, played=playout.played_ms("r1"),
                                 held_after=source.held_ms())
                if silent_run >= 5 and playout.paused:
                    gap_seen.set()
                if finished and silent_run >= 10:
                    return

        reader = asyncio.create_task(read())
        sender = asyncio.create_task(source.play(playout, next_frame, frames_per_capture=frames_per_capture))
        try:
            await asyncio.wait_for(gap_seen.wait(), 10)
            asked["played_in_gap"] = playout.played_ms("r1")
            assert playout.resume()
            await asyncio.wait_for(reader, 10)
        finally:
            await cancel(sender, reader)
    return heard, finished, asked


async def test_a_pause_takes_back_the_sources_queue_and_the_resume_plays_it_with_nothing_skipped_or_doubled():
    heard, finished, asked = await _paused_and_resumed("take-back", pause_at_frames_out=20)
    # The pause was asked with 20 frames handed; the queue's two went back (what plays after the
    # resume starts where the caller stopped hearing), so it counts 18 frames and the fade played.
    assert asked["played_in_gap"] == pytest.approx(18 * 20 + FADE_SAMPLES / 48, abs=0.01)
    _assert_heard_once_in_order(heard, REPLY)
    assert finished == [PlaybackFinished("r1", 1000.0, interrupted=False)]


@pytest.mark.parametrize("frames_per_capture", [1, 2])
async def test_a_pause_asked_while_a_capture_waits_empties_the_queue_at_once_frame_in_flight_included(
        frames_per_capture):
    """The call path's pause (``on_paused``) comes between the sender's captures: the source's
    queue, with the capture still waiting, goes back to the playout then, not when that capture
    returns; the caller hears the reply once, in order, across the pause."""
    heard, finished, asked = await _paused_and_resumed("take-back-at-once", frames_per_capture=frames_per_capture,
                                                       pause_at_loud_heard=15)
    # Playing steadily, the queue holds 40 ms to 40 + the capture's (counting the capture still
    # waiting; 20-40 without it); all of it went back, so the ledger stands where the caller
    # stopped hearing.
    assert 40.0 <= asked["held"] <= 40.0 + 20.0 * frames_per_capture, asked
    assert asked["played"] == pytest.approx(asked["handed_ms"] - asked["held"], abs=0.01), asked
    assert asked["held_after"] == 0.0, asked
    # The queue's ticks are known from when acknowledgements reach Python; on a loaded machine
    # one can come a few ms after its tick, and a pause in between takes back 10 ms the caller
    # had heard. Those play again inside the fades (240 samples out, 240 in), faded: at most the
    # fades' two end samples, at full level, repeat. A capture not given back would skip 20 ms
    # or more, one played on would repeat it at full level.
    _assert_heard_once_in_order(heard, REPLY, repeated_at_most=2)
    assert finished == [PlaybackFinished("r1", 1000.0, interrupted=False)]


def _assert_heard_once_in_order(heard: list[np.ndarray], reply: int, *, repeated_at_most: int = 0) -> None:
    indices = _full_indices(np.concatenate(heard))
    first_heard = list(dict.fromkeys(indices))  # each sample where it was first heard
    assert len(indices) - len(first_heard) <= repeated_at_most, "a stretch of the reply was heard twice"
    assert first_heard == sorted(first_heard)
    missing = sorted(set(range(reply)) - set(first_heard))
    # Only the fades' samples (out, then in after the resume) are not heard at full level.
    assert len(missing) <= 2 * FADE_SAMPLES, f"{len(missing)} samples of the reply skipped"
