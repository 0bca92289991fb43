import asyncio

import numpy as np
import pytest

from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, ChunkStarted, PlaybackFinished, PlayoutQueue


def tone(ms: float, level: float = 0.5) -> np.ndarray:
    return np.full(int(48 * ms), level, dtype=np.float32)


def test_empty_queue_gives_silence():
    queue = PlayoutQueue()
    frame = queue.next_frame()
    assert frame.dtype == np.int16 and frame.shape == (FRAME_SAMPLES,)
    assert not frame.any()
    assert not queue.playing and queue.underruns == 0


def test_clear_silences_the_very_next_frame_and_reports_what_was_dropped():
    queue = PlayoutQueue()
    queue.capture(tone(100), "r1")
    assert queue.next_frame().any()
    cleared = queue.clear()
    assert cleared.response_ids == ["r1"]
    assert cleared.dropped_ms("r1") == 80.0
    assert not queue.next_frame().any()
    assert not queue.playing
    assert queue.played_ms("r1") == 20.0


def test_played_record_is_exact_per_response_across_frame_boundaries():
    queue = PlayoutQueue()
    queue.capture(tone(30), "r1", tag="first")
    queue.capture(tone(25), "r2", tag="second")
    queue.flush("r1")
    frames = [queue.next_frame() for _ in range(2)]
    assert all(f.all() for f in frames)
    progress = queue.take_progress()
    assert progress == [
        ChunkStarted("r1", "first", True),
        PlaybackFinished("r1", 30.0),
        ChunkStarted("r2", "second", True),
    ]
    assert queue.played_ms("r1") == 30.0
    assert queue.played_ms("r2") == 10.0
    assert queue.current_response_id == "r2"


def test_underrun_counts_only_silence_mid_response():
    queue = PlayoutQueue()
    queue.next_frame()  # nothing playing: not an underrun
    queue.capture(tone(30), "r1")
    queue.next_frame()
    queue.next_frame()  # 10 ms short mid-response
    queue.next_frame()  # still waiting for more of r1
    assert queue.underruns == 2
    queue.capture(tone(10), "r1")
    queue.flush("r1")
    queue.next_frame()  # ends inside this frame: finished, not an underrun
    queue.next_frame()
    assert queue.underruns == 2
    assert queue.played_ms("r1") == 40.0
    assert PlaybackFinished("r1", 40.0) in queue.take_progress()


def test_audio_for_a_cleared_response_is_refused():
    queue = PlayoutQueue()
    queue.capture(tone(40), "r1")
    queue.next_frame()
    queue.clear()
    queue.capture(tone(40), "r1")
    assert not queue.next_frame().any()
    queue.capture(tone(40), "r2")
    assert queue.next_frame().any()


def test_drop_response_keeps_other_responses():
    queue = PlayoutQueue()
    queue.capture(tone(40), "r1")
    queue.capture(tone(40, 0.25), "r2")
    assert queue.drop_response("r1") == 40 * 48
    frame = queue.next_frame()
    assert abs(frame[0] / 32767 - 0.25) < 1e-3
    assert queue.played_ms("r1") == 0.0


async def _pace(queue: PlayoutQueue) -> None:
    """The pacing side without the clock: hand out frames as fast as the loop turns."""
    while True:
        queue.next_frame()
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_wait_for_playout_returns_the_position_played_and_whether_it_was_cut():
    queue = PlayoutQueue()
    queue.capture(tone(50), "r1")
    queue.flush("r1")
    queue.capture(tone(200), "r2")
    pacer = asyncio.create_task(_pace(queue))
    try:
        first = await asyncio.wait_for(queue.wait_for_playout("r1"), 5)
        assert first == PlaybackFinished("r1", 50.0, interrupted=False)
        second = asyncio.ensure_future(queue.wait_for_playout("r2"))
        while queue.played_ms("r2") < 60.0:  # let some of r2 go out
            await asyncio.sleep(0)
        cleared = queue.clear()
        ended = await asyncio.wait_for(second, 5)
        assert ended.interrupted and ended.played_ms == queue.played_ms("r2") == 200.0 - cleared.dropped_ms("r2")
        # A waiter that comes after the end gets it at once.
        assert await queue.wait_for_playout("r1") == first
        queue.capture(tone(40), "r3")
        queue.drop_response("r3")
        assert (await queue.wait_for_playout("r3")).interrupted
    finally:
        pacer.cancel()


async def _after_what_is_scheduled() -> None:
    """Back once every callback scheduled so far has run, and the tasks those woke have
    stepped (the loop runs ready callbacks in order): an ordering signal, not a wait."""
    turn = asyncio.Event()
    asyncio.get_running_loop().call_soon(turn.set)
    await turn.wait()


async def test_wait_for_audio_returns_when_audio_is_queued_and_at_once_while_some_is():
    queue = PlayoutQueue()
    waiter = asyncio.ensure_future(queue.wait_for_audio())
    await asyncio.sleep(0)  # the waiter's first step: a return at once would finish it here
    assert not waiter.done()
    queue.capture(np.zeros(0, np.float32), "r1")  # nothing to play: no wake-up
    await _after_what_is_scheduled()
    assert not waiter.done()
    queue.capture(tone(40), "r1")
    await asyncio.wait_for(waiter, 5)
    await asyncio.wait_for(queue.wait_for_audio(), 5)  # audio is queued: no wait
    queue.next_frame(), queue.next_frame()
    assert not queue.next_frame().any()
    again = asyncio.ensure_future(queue.wait_for_audio())  # played out: waits again
    await asyncio.sleep(0)  # its first step
    assert not again.done()
    again.cancel()


async def test_wait_for_audio_wakes_a_waiter_on_another_loop_thread():
    queue = PlayoutQueue()
    parked = asyncio.Event()

    def other_thread() -> None:
        async def wait() -> None:
            pending = asyncio.ensure_future(queue.wait_for_audio())
            await asyncio.sleep(0)
            loop.call_soon_threadsafe(parked.set)
            await pending

        asyncio.run(wait())

    loop = asyncio.get_running_loop()
    thread = asyncio.ensure_future(asyncio.to_thread(other_thread))
    await asyncio.wait_for(parked.wait(), 5)
    queue.capture(tone(20), "r1")
    await asyncio.wait_for(thread, 5)
