"""The call's timings, from the frames that went out (the figures the page and /metrics show)."""

from duplex_agent.webrtc.media.call_figures import CallTimings
from duplex_agent.webrtc.media.latency import LatencyFigures
from duplex_agent.webrtc.media.playout import ChunkStarted, PlaybackPaused, PlaybackResumed


def test_a_barge_in_without_a_pause_is_timed_to_the_next_frame_out():
    timings = CallTimings(LatencyFigures())
    timings.barge_in(10.0, silent_at=None)
    assert timings.figures.last("barge_in_ms") is None
    timings.frame_out([], 10.05)
    timings.frame_out([], 10.07)
    assert [round(ms, 6) for ms in timings.figures.recent("barge_in_ms")] == [50.0]


def test_a_barge_in_after_a_pause_is_timed_to_the_pause_heard():
    timings = CallTimings(LatencyFigures())
    timings.forget_pause_heard()
    timings.frame_out([PlaybackPaused("r1")], 5.02)
    timings.barge_in(5.0, silent_at=timings.take_pause_heard_at())
    assert round(timings.figures.last("barge_in_ms"), 6) == 20.0
    assert timings.take_pause_heard_at() is None


def test_turn_and_output_latency_start_at_the_replys_first_frame_and_a_resume_records_the_gap():
    timings = CallTimings(LatencyFigures())
    timings.speech_ended(1.0)
    timings.frame_out([ChunkStarted("r1", 1.2, True)], 1.5)
    timings.frame_out([ChunkStarted("r1", None, False), PlaybackResumed("r1", 40.0)], 1.6)
    assert round(timings.figures.last("turn_ms"), 6) == 500.0
    assert round(timings.figures.last("output_added_ms"), 6) == 300.0
    assert len(timings.figures.recent("turn_ms")) == 1  # one turn, not one per chunk
    assert timings.figures.recent("false_pause_ms") == [40.0]
