"""The call path's pause at the first window of caller sound over the agent, then the cancel or the
resume: what the caller hears, what the model is told, what /metrics counts (fake conversation,
energy VAD: one piece at a time)."""

import dataclasses

import numpy as np
import pytest

from duplex_agent.agent.metrics import REGISTRY
from duplex_agent.agent.protocol.events import PlaybackAck, ResponseAudioDone, ResponseCancel, ResponseDone
from duplex_agent.webrtc.media.barge_in import MAX_FALSE_PAUSES
from duplex_agent.webrtc.media.call_audio import CallAudioPath

from .fakes import CAPS, EnergyVadModel, FakeConversation
from .test_call_audio import LOUD, QUIET, delta

pytestmark = pytest.mark.asyncio

BURST = [LOUD, LOUD]  # 40 ms: two 32 ms windows over the threshold, short of the 100 ms minimum speech
SPEECH = [LOUD] * 10  # 200 ms: holds


async def open_call(caps=CAPS, **options):
    conversation = FakeConversation(caps)
    path = CallAudioPath(conversation, vad_model=EnergyVadModel(), **options)
    await path.start()
    return conversation, path


async def reply(conversation, path, ms: float, rid: str = "r1") -> None:
    conversation.emit(delta(rid, ms))
    conversation.emit(ResponseAudioDone(response_id=rid, item_id="i-" + rid))
    conversation.emit(ResponseDone(response_id=rid, status="completed"))
    await conversation.handled()


def paced(path, caller_frames) -> list[np.ndarray]:
    """The transport's pacing: one caller frame in, one agent frame out."""
    heard = []
    for frame in caller_frames:
        path.push_caller_frame(frame, 48000)
        heard.append(path.next_frame())
    return heard


def until_played(path, limit: int = 500) -> list[np.ndarray]:
    heard = []
    while path.playout.playing or path.playout.paused:
        assert len(heard) < limit, "the reply never finished"
        heard.append(path.next_frame())
    return heard


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name + "_total") or 0.0


def loud_frames(frames) -> int:
    return sum(bool(f.any()) for f in frames)


async def test_a_short_sound_pauses_the_reply_and_it_resumes_with_nothing_skipped():
    conversation, path = await open_call()
    before = {n: counter(n) for n in ("duplex_barge_in_pauses", "duplex_barge_in_false_pauses")}
    await reply(conversation, path, 1000)
    heard = paced(path, [QUIET] * 5 + BURST)
    assert path.playout.paused and path.pauses == 1
    # The frame after the first window over the threshold faded out: the offset grid's, ending 12 ms
    # into the burst, so the agent's frame answering the burst's first frame; the next one is silence.
    assert heard[-2].any() and not heard[-2][-600:].any() and not heard[-1].any()
    heard += paced(path, [QUIET] * 6)
    assert not path.playout.paused and path.false_pauses == 1
    heard += until_played(path)
    assert not conversation.sent_of(ResponseCancel)
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(1000.0)  # every sample went out
    gap = path.figures.last("false_pause_ms")
    silent = len(heard) - loud_frames(heard)
    assert gap is not None and 0 < gap <= 20.0 * silent + 20.0  # the pause is all the caller missed
    assert silent <= 6
    assert counter("duplex_barge_in_pauses") == before["duplex_barge_in_pauses"] + 1
    assert counter("duplex_barge_in_false_pauses") == before["duplex_barge_in_false_pauses"] + 1
    assert path.barge_ins == 0 and path.figures.last("barge_in_ms") is None
    await path.close()


async def test_held_speech_cancels_and_the_barge_in_is_timed_from_the_pause():
    conversation, path = await open_call()
    confirmed = counter("duplex_barge_ins_confirmed")
    await reply(conversation, path, 1000)
    paced(path, [QUIET] * 5)
    paced(path, SPEECH[:2])
    assert path.playout.paused and not conversation.sent_of(ResponseCancel)
    paced(path, SPEECH[2:])
    cancel = conversation.sent_of(ResponseCancel)[0]
    assert (cancel.response_id, cancel.reason) == ("r1", "barge_in")
    # acked at what was played: 5 full frames and the pause's 5 ms fade-out, in the frame answering the
    # speech's first (the offset grid's window over the threshold ends 12 ms into it)
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(5 * 20.0 + 5.0)
    assert path.barge_ins == 1 and counter("duplex_barge_ins_confirmed") == confirmed + 1
    assert path.figures.last("barge_in_ms") is not None  # onset -> the pause's fade-out frame
    assert not paced(path, [QUIET])[0].any()
    await path.close()


async def test_continuous_noise_pauses_a_reply_at_most_max_false_pauses_times():
    """Bursts of noise all through the reply: a few pauses, then it plays on unpaused, whole."""
    conversation, path = await open_call()
    await reply(conversation, path, 3000)
    heard = paced(path, [QUIET] * 3 + (BURST + [QUIET] * 4) * 12)
    heard += until_played(path)
    assert path.pauses == MAX_FALSE_PAUSES == path.false_pauses
    # each pause spans two bursts (the second comes within its release hold, bounded by max_pause_ms);
    # every later burst is withheld
    assert path.pauses_withheld == 12 - 2 * MAX_FALSE_PAUSES
    assert not conversation.sent_of(ResponseCancel)
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(3000.0)
    # a new reply gets its pauses back
    await reply(conversation, path, 500, rid="r2")
    paced(path, [QUIET] * 2 + BURST)
    assert path.playout.paused and path.pauses == MAX_FALSE_PAUSES + 1
    await path.close()


async def test_the_minimum_speech_follows_the_sessions_turn_detection():
    conversation, path = await open_call(turn_detection={"type": "server_vad", "min_speech_ms": 250})
    await reply(conversation, path, 2000)
    paced(path, [QUIET] * 3 + SPEECH)  # 200 ms of speech: not yet a barge-in under 250 ms
    assert path.playout.paused and not conversation.sent_of(ResponseCancel)
    paced(path, SPEECH)
    assert conversation.sent_of(ResponseCancel)
    await path.close()


CONTINUOUS_OVERLAP = dataclasses.replace(CAPS, input_mode="continuous", unit_samples=1280, handles_overlap=True)


async def test_a_model_that_handles_overlap_is_never_paused_under_listen():
    """Under overlap_policy listen the model alone decides: its audio, its own backchannels over the
    caller included, goes out untouched."""
    conversation, path = await open_call(CONTINUOUS_OVERLAP, overlap_policy="listen")
    await reply(conversation, path, 1000)
    heard = paced(path, [QUIET] * 8 + BURST + [QUIET] * 3 + SPEECH)
    assert loud_frames(heard) == len(heard) and path.pauses == 0
    assert not conversation.sent_of(ResponseCancel)
    await path.close()


async def test_a_model_that_handles_overlap_resumes_after_a_short_sound_with_its_later_audio_whole():
    """Under barge_in: paused as any model; a sound that does not hold gives the model its audio
    back where it stopped, with what it produced meanwhile queued behind it (nothing skipped)."""
    conversation, path = await open_call(CONTINUOUS_OVERLAP)
    conversation.emit(delta("m1", 80))
    conversation.emit(delta("m1", 80, start_ms=80))  # past the one-unit jitter hold
    await conversation.handled()
    paced(path, [QUIET] * 3 + BURST)
    assert path.playout.paused
    for n in range(2, 6):  # the model keeps talking, one 80 ms unit per tick
        conversation.emit(delta("m1", 80, start_ms=80 * n))
    conversation.emit(ResponseAudioDone(response_id="m1", item_id="i-m1"))
    await conversation.handled()
    paced(path, [QUIET] * 6)  # the burst's windows drop, and the release hold runs out
    assert not path.playout.paused and path.false_pauses == 1
    until_played(path)
    assert not conversation.sent_of(ResponseCancel)
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(480.0)
    await path.close()


async def test_a_reply_started_while_the_caller_talks_is_not_paused():
    """A model that speaks over the caller (a backchannel) started it there: the edge leaves it be."""
    conversation, path = await open_call(CONTINUOUS_OVERLAP)
    paced(path, SPEECH[:4])  # the caller is talking
    conversation.emit(delta("m1", 80))
    conversation.emit(delta("m1", 80, start_ms=80))
    await conversation.handled()
    heard = paced(path, SPEECH)
    assert path.pauses == 0 and not conversation.sent_of(ResponseCancel)
    assert loud_frames(heard) >= 7
    await path.close()


class HalfSureVadModel(EnergyVadModel):
    """Loud windows score 0.6: speech at the default threshold, not at a stricter one."""

    def probability(self, window: np.ndarray) -> float:
        return 0.6 * super().probability(window)


@pytest.mark.parametrize("threshold, pauses, cancels", [(0.5, True, True), (0.7, True, False), (0.9, False, False)])
async def test_the_onset_thresholds_follow_the_sessions_turn_detection(threshold, pauses, cancels):
    conversation = FakeConversation(CAPS)
    path = CallAudioPath(conversation, vad_model=HalfSureVadModel(), pause_on_level=False,  # the windows' rule alone
                         turn_detection={"type": "server_vad", "threshold": threshold})
    await path.start()
    await reply(conversation, path, 2000)
    paced(path, [QUIET] * 3 + BURST)  # windows at 0.6: a pause at pause_threshold(threshold) <= 0.6
    assert path.playout.paused is pauses and path.pauses == int(pauses)
    paced(path, SPEECH + [QUIET] * 3)
    assert bool(conversation.sent_of(ResponseCancel)) is cancels  # held at 0.6: a barge-in only at threshold <= 0.6
    assert path.false_pauses == int(pauses and not cancels)  # not speech at 0.7: the quiet resumes it
    await path.close()


SOFT = np.full(960, 0.03, dtype=np.float32) * np.sign(np.sin(np.arange(960) / 5)).astype(np.float32)  # -30 dBFS


async def test_a_rise_in_the_callers_level_pauses_on_its_first_frame_and_the_vad_still_judges_it():
    """A -30 dBFS sound: over the level rule, under the (energy) VAD's speech: paused on the frame it
    arrives in, before any window, and resumed once the windows have had their grace, nothing skipped."""
    conversation, path = await open_call()
    before = counter("duplex_barge_in_level_pauses")
    await reply(conversation, path, 1000)
    heard = paced(path, [QUIET] * 5 + [SOFT])
    assert path.playout.paused and path.pauses == path.level_pauses == 1
    assert not heard[-1][-600:].any()  # the frame answering the sound's first frame faded out
    assert counter("duplex_barge_in_level_pauses") == before + 1
    heard += paced(path, [SOFT] * 10)  # loud but never speech: resumed after the grace (96 ms of windows)
    assert not path.playout.paused and path.false_pauses == 1
    assert 0 < path.figures.last("false_pause_ms") <= 160.0
    until_played(path)
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(1000.0)
    assert not conversation.sent_of(ResponseCancel)
    await path.close()


async def test_held_speech_after_a_level_pause_cancels_and_without_the_level_rule_the_vad_pauses_later():
    conversation, path = await open_call()
    await reply(conversation, path, 1000)
    paced(path, [QUIET] * 5 + [SOFT])
    paced(path, SPEECH)
    assert path.level_pauses == 1 and path.barge_ins == 1 and path.false_pauses == 0
    assert conversation.sent_of(ResponseCancel)[0].reason == "barge_in"
    # acked at what was played: 5 frames and the fade-out, in the frame answering the sound's first
    assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(5 * 20.0 + 5.0)
    await path.close()

    conversation, path = await open_call(pause_on_level=False)
    await reply(conversation, path, 1000)
    paced(path, [QUIET] * 5 + [SOFT] * 3)
    assert not path.playout.paused and path.pauses == 0  # the VAD does not call it speech
    paced(path, SPEECH)
    assert path.level_pauses == 0 and path.barge_ins == 1
    assert conversation.sent_of(PlaybackAck)[0].played_ms > 8 * 20.0
    await path.close()
