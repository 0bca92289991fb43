"""The call's audio output alone: capture -> played position -> one ack per response."""

import numpy as np

from duplex_agent.agent.protocol.events import ResponseAudioDelta
from duplex_agent.webrtc.media.agent_output import RECENT_RESPONSES_KEPT, AgentAudioOutput, PlaybackEnded
from duplex_agent.webrtc.media.playout import ChunkStarted

RATE = 48000


def delta(response_id: str, ms: float, *, start_ms: float = 0.0, marks=None) -> ResponseAudioDelta:
    audio = np.full(int(RATE * ms / 1000), 0.25, dtype=np.float32)
    return ResponseAudioDelta(response_id=response_id, item_id=f"item-{response_id}", audio=audio,
                              sample_rate=RATE, audio_start_ms=start_ms, audio_ms=ms, marks=marks or [])


class Recorder:
    def __init__(self, **kwargs) -> None:
        self.ended: list[PlaybackEnded] = []
        self.cleared = 0
        self.output = AgentAudioOutput(on_playback_finished=self.ended.append, on_cleared=self._cleared, **kwargs)

    def _cleared(self) -> None:
        self.cleared += 1

    def frames(self, n: int) -> list:
        return [self.output.next_frame() for _ in range(n)]


def test_a_captured_reply_is_acked_once_at_its_played_length_when_it_has_played_out():
    rec = Recorder()
    rec.output.capture_frame(delta("r1", 60))
    rec.output.capture_frame(delta("r1", 40, start_ms=60))
    rec.output.flush("r1")
    played = rec.frames(5)
    assert all(frame.any() for frame, _ in played)
    assert isinstance(played[0][1][0], ChunkStarted)
    assert rec.ended == [PlaybackEnded("r1", 100.0, interrupted=False, heard_text=None)]
    rec.output.acknowledge("r1")  # a second ack of the same response is not sent
    assert len(rec.ended) == 1
    assert not rec.frames(1)[0][0].any()


def test_clear_buffer_acks_at_the_played_position_with_the_words_heard_and_drops_late_audio():
    rec = Recorder()
    marks = [{"text": "hello", "start_ms": 0.0, "end_ms": 40.0}, {"text": "there", "start_ms": 60.0, "end_ms": 200.0}]
    rec.output.capture_frame(delta("r1", 200, marks=marks))
    rec.frames(3)
    rec.output.clear_buffer()
    assert rec.ended == [PlaybackEnded("r1", 60.0, interrupted=True, heard_text="hello")]
    assert rec.cleared == 1
    assert not rec.frames(1)[0][0].any()
    rec.output.capture_frame(delta("r1", 100, start_ms=200))  # late audio of the cleared reply
    assert not rec.output.playout.playing


def test_clear_buffer_also_acks_a_reply_still_held_by_the_jitter_hold():
    rec = Recorder(jitter_ms=80.0)
    rec.output.capture_frame(delta("r1", 80))  # within the hold: nothing queued yet
    assert not rec.output.playout.playing
    rec.output.clear_buffer()
    assert rec.ended == [PlaybackEnded("r1", 0.0, interrupted=True, heard_text=None)]


def test_the_jitter_hold_releases_a_reply_once_more_than_the_hold_has_come():
    rec = Recorder(jitter_ms=80.0)
    rec.output.capture_frame(delta("r1", 80))
    assert not rec.output.playout.playing and rec.output.receiving
    rec.output.capture_frame(delta("r1", 80, start_ms=80))
    assert rec.output.playout.queued_ms == 160.0
    rec.output.flush("r1")
    rec.frames(8)
    assert rec.ended == [PlaybackEnded("r1", 160.0, interrupted=False, heard_text=None)]
    assert not rec.output.receiving


def test_interrupt_names_the_reply_heard_first_and_leaves_the_acks_to_the_caller():
    rec = Recorder()
    rec.output.capture_frame(delta("r1", 40))
    rec.output.flush("r1")
    rec.output.capture_frame(delta("r2", 100))
    rec.frames(3)  # r1 has played out, r2 is 20 ms in
    assert [e.response_id for e in rec.ended] == ["r1"]
    assert rec.output.interrupt() == ["r2"]
    assert rec.cleared == 1 and len(rec.ended) == 1
    rec.output.acknowledge("r2")
    assert rec.ended[-1] == PlaybackEnded("r2", 20.0, interrupted=True, heard_text=None)


def test_drop_stops_one_reply_and_acks_it_where_it_got_to():
    rec = Recorder()
    rec.output.capture_frame(delta("r1", 100))
    rec.frames(2)
    rec.output.drop("r1")
    assert rec.ended == [PlaybackEnded("r1", 40.0, interrupted=True, heard_text=None)]
    assert not rec.frames(1)[0][0].any()


def test_bookkeeping_stays_bounded_over_a_thousand_responses():
    rec = Recorder(jitter_ms=20.0)
    for n in range(1000):
        rid = f"r{n}"
        rec.output.capture_frame(delta(rid, 20, marks=[{"text": "word", "start_ms": 0.0, "end_ms": 20.0}]))
        rec.output.capture_frame(delta(rid, 20, start_ms=20))
        if n % 3 == 0:
            rec.output.clear_buffer()
        elif n % 3 == 1:
            rec.output.drop(rid)
        else:
            rec.output.flush(rid)
            rec.frames(2)
        assert rec.output.remembered_responses <= 2 * RECENT_RESPONSES_KEPT + 1
    assert [e.response_id for e in rec.ended] == [f"r{n}" for n in range(1000)]
    assert [e.interrupted for e in rec.ended[:3]] == [True, True, False]
    for rid in ("r999", "r997"):  # the recent cut replies are still remembered: their late audio is dropped
        rec.output.capture_frame(delta(rid, 40, start_ms=40))
    assert not rec.output.playout.playing and not rec.output.receiving
