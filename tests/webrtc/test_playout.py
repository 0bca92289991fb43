import asyncio

import numpy as np

from duplex_agent.webrtc.media.playout import (
    FADE_SAMPLES,
    FRAME_SAMPLES,
    ChunkStarted,
    PlaybackFinished,
    PlaybackPaused,
    PlaybackResumed,
    PlayoutQueue,
)


def steady(ms: float, level: float = 0.5) -> np.ndarray:
    """A constant signal: every sample at ``level``."""
    return np.full(int(48 * ms), level, dtype=np.float32)


def test_empty_queue_gives_silence():
    queue = PlayoutQueue()
    frame = queue.next_frame()
    assert frame.dtype == np.int16 and frame.shape == (FRAME_SAMPLES,)
    assert not frame.any()
    assert not queue.playing and queue.underruns == 0


def test_clear_silences_the_very_next_frame_and_reports_what_was_dropped():
    queue = PlayoutQueue()
    queue.capture(steady(100), "r1")
    assert queue.next_frame().any()
    cleared = queue.clear()
    assert cleared.response_ids == ["r1"]
    assert cleared.dropped_ms("r1") == 80.0
    assert not queue.next_frame().any()
    assert not queue.playing
    assert queue.played_ms("r1") == 20.0


def test_played_record_is_exact_per_response_across_frame_boundaries():
    queue = PlayoutQueue()
    queue.capture(steady(30), "r1", tag="first")
    queue.capture(steady(25), "r2", tag="second")
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
    queue.capture(steady(30), "r1")
    queue.next_frame()
    queue.next_frame()  # 10 ms short mid-response
    queue.next_frame()  # still waiting for more of r1
    assert queue.underruns == 2
    queue.capture(steady(10), "r1")
    queue.flush("r1")
    queue.next_frame()  # ends inside this frame: finished, not an underrun
    queue.next_frame()
    assert queue.underruns == 2
    assert queue.played_ms("r1") == 40.0
    assert PlaybackFinished("r1", 40.0) in queue.take_progress()


def test_audio_for_a_cleared_response_is_refused():
    queue = PlayoutQueue()
    queue.capture(steady(40), "r1")
    queue.next_frame()
    queue.clear()
    queue.capture(steady(40), "r1")
    assert not queue.next_frame().any()
    queue.capture(steady(40), "r2")
    assert queue.next_frame().any()


def test_drop_response_keeps_other_responses():
    queue = PlayoutQueue()
    queue.capture(steady(40), "r1")
    queue.capture(steady(40, 0.25), "r2")
    assert queue.drop_response("r1") == 40 * 48
    frame = queue.next_frame()
    assert abs(frame[0] / 32767 - 0.25) < 1e-3
    assert queue.played_ms("r1") == 0.0


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
    queue.capture(steady(40), "r1")
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
    queue.capture(steady(20), "r1")
    await asyncio.wait_for(thread, 5)


def sine(ms: float, hz: float = 440.0, level: float = 0.5) -> np.ndarray:
    return (level * np.sin(2 * np.pi * hz * np.arange(int(48 * ms)) / 48000)).astype(np.float32)


def test_pause_books_only_what_was_played_and_resume_plays_the_next_sample():
    queue = PlayoutQueue()
    reply = np.linspace(0.1, 0.9, 48 * 200, dtype=np.float32)  # every sample distinct
    queue.capture(reply, "r1")
    queue.flush("r1")
    heard = [queue.next_frame() for _ in range(3)]
    assert queue.pause() and queue.paused and not queue.pause()
    fade = queue.next_frame()
    played = 3 * FRAME_SAMPLES + FADE_SAMPLES  # the fade-out's samples went out (attenuated)
    assert fade[:FADE_SAMPLES].any() and not fade[FADE_SAMPLES:].any()
    assert isinstance(queue.take_progress()[-1], PlaybackPaused)
    silent = [queue.next_frame() for _ in range(5)]
    assert not any(f.any() for f in silent)
    assert queue.played_ms("r1") == 1000.0 * played / 48000  # paused time is not played audio
    assert queue.playing and queue.underruns == 0

    assert queue.resume() and not queue.paused
    back = queue.next_frame().astype(np.float32) / 32767.0
    expected = reply[played : played + FRAME_SAMPLES]
    np.testing.assert_allclose(back[FADE_SAMPLES:], expected[FADE_SAMPLES:], atol=1 / 32767)  # the next sample on
    assert abs(back[0]) < abs(expected[0]) / 100  # faded in
    resumed = [p for p in queue.take_progress() if isinstance(p, PlaybackResumed)]
    assert resumed == [PlaybackResumed("r1", 1000.0 * (FRAME_SAMPLES - FADE_SAMPLES + 5 * FRAME_SAMPLES) / 48000)]

    while queue.playing:
        queue.next_frame()
    finished = [p for p in queue.take_progress() if isinstance(p, PlaybackFinished)]
    assert finished == [PlaybackFinished("r1", 200.0, interrupted=False)]  # nothing skipped
    assert len(heard) == 3


def test_the_fades_have_no_click():
    """The largest step between samples across a pause and a resume stays at the tone's own."""
    queue = PlayoutQueue()
    tone_ = sine(400)
    queue.capture(tone_, "r1")
    out = [queue.next_frame() for _ in range(4)]
    queue.pause()
    out += [queue.next_frame() for _ in range(3)]
    queue.resume()
    out += [queue.next_frame() for _ in range(4)]
    heard = np.concatenate(out).astype(np.float32) / 32767.0
    own_step = float(np.abs(np.diff(tone_)).max())  # 0.029 for a 0.5, 440 Hz sine
    assert float(np.abs(np.diff(heard)).max()) <= own_step + 2 / 32767
    # the pause lands where the tone is loud: cut there without a fade, it would step by 0.47
    assert abs(tone_[4 * FRAME_SAMPLES]) > 0.4


def test_a_pause_and_resume_between_two_frames_is_never_heard():
    queue = PlayoutQueue()
    queue.capture(steady(100), "r1")
    queue.next_frame()
    assert queue.pause() and queue.resume()
    assert queue.next_frame().all()
    assert not [p for p in queue.take_progress() if isinstance(p, (PlaybackPaused, PlaybackResumed))]


def test_clear_ends_a_pause_and_the_next_reply_plays():
    queue = PlayoutQueue()
    queue.capture(steady(100), "r1")
    queue.next_frame()
    queue.pause()
    queue.next_frame()
    queue.clear()
    assert not queue.paused and not queue.resume()
    queue.capture(steady(40), "r2")
    assert queue.next_frame().all()


def test_pause_refuses_when_nothing_plays():
    queue = PlayoutQueue()
    assert not queue.pause() and not queue.paused


def ramp(samples: int, start: int = 0) -> np.ndarray:
    """Sample i is (start + i) / 2**15: each comes out of the queue as its own int16 code."""
    return (np.arange(start, start + samples) / 32767.0).astype(np.float32)


def test_take_back_queues_the_unheard_tail_again_faded_out_now_and_played_after_the_resume():
    queue = PlayoutQueue()
    queue.capture(ramp(9600), "r1")  # 200 ms
    for _ in range(5):
        queue.next_frame()
    assert queue.pause()
    assert queue.take_back(30.0)  # the transport's queue held a frame and a half
    assert queue.played_ms("r1") == 70.0
    faded = queue.next_frame()
    assert faded[0] == 3360 and not faded[FADE_SAMPLES:].any()  # the fade starts where the caller stopped
    assert queue.played_ms("r1") == 75.0
    queue.resume()
    resumed = queue.next_frame()
    assert resumed[FADE_SAMPLES - 1] == 3360 + 2 * FADE_SAMPLES - 1  # then on with nothing skipped
    assert queue.played_ms("r1") == 95.0


def test_take_back_skips_an_underrun_frames_silence():
    queue = PlayoutQueue()
    queue.capture(ramp(1440), "r1")  # 30 ms: the second frame is half silence
    queue.next_frame()
    queue.next_frame()
    queue.capture(ramp(960, start=1440), "r1")
    queue.next_frame()
    assert queue.pause()
    assert queue.take_back(40.0)  # the last frame and the half-silent one: 30 ms of audio
    assert queue.played_ms("r1") == 20.0
    faded = queue.next_frame()  # the half-silent frame's audio, then the last's, back to back
    assert faded[0] == 960 and queue.played_ms("r1") == 25.0
    queue.resume()
    assert queue.next_frame()[FADE_SAMPLES - 1] == 960 + 2 * FADE_SAMPLES - 1


def test_take_back_refuses_what_it_cannot_give_back_and_changes_nothing():
    queue = PlayoutQueue()
    queue.capture(steady(20), "r1")
    queue.flush("r1")
    queue.capture(steady(100), "r2")
    queue.next_frame()  # r1 played to its end (reported) ...
    queue.next_frame()  # ... then r2's first frame
    assert not queue.take_back(20.0)  # not paused
    assert queue.pause()
    assert not queue.take_back(40.0)  # reaches into r1, whose end was reported
    assert not queue.take_back(200.0)  # more than was handed out
    assert queue.take_back(20.0)  # r2's own frame
    assert queue.played_ms("r2") == 0.0 and queue.played_ms("r1") == 20.0
    queue.next_frame()  # the fade went out: the pause was heard
    assert not queue.take_back(5.0)
    queue.resume()
    queue.next_frame()
    assert queue.pause()
    queue.clear()
    assert not queue.take_back(20.0)  # cleared: nothing is paused any more
