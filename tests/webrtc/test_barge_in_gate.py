"""The barge-in gate's state machine, window by window: pause, confirm, resume, the bound."""

from duplex_agent.webrtc.media.barge_in import BargeInGate, BargeInRules, Verdict

SPEECH, HOVER, QUIET = 0.9, 0.4, 0.1  # over the threshold, between it and the release, below the release


def feed(gate: BargeInGate, probabilities: list[float], *, playing: bool = True, reply: str = "r1",
         start_at: float = 0.0) -> list[Verdict | None]:
    return [gate.push(p, at=start_at + 0.032 * i, agent_playing=playing, reply=reply)
            for i, p in enumerate(probabilities)]


def test_the_first_window_over_the_threshold_pauses_and_held_speech_confirms_at_the_minimum_speech():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    verdicts = feed(gate, [QUIET, SPEECH, SPEECH, HOVER, SPEECH, SPEECH], start_at=1.0)
    # pause at the first window; the hover window neither adds nor drops; the 4th speech window is 128 ms >= 100
    assert verdicts == [None, Verdict.PAUSE, None, None, None, Verdict.CONFIRM]
    assert gate.onset_at == 1.032 and not gate.paused


def test_a_sound_that_does_not_hold_resumes_one_quiet_window_after_it_dropped():
    gate = BargeInGate()
    # the first window below the release drops the candidate; the agent resumes after one more quiet window
    assert feed(gate, [SPEECH, SPEECH, QUIET, QUIET]) == [Verdict.PAUSE, None, None, Verdict.RESUME]
    assert not gate.paused
    # the next sound pauses again: a cough is not speech, and the caller's next words still count
    assert feed(gate, [SPEECH]) == [Verdict.PAUSE]


def test_an_unconfirmed_pause_lasts_at_most_max_pause_ms_and_the_candidate_may_still_confirm():
    gate = BargeInGate(BargeInRules(max_pause_ms=128.0, min_speech_ms=100.0))
    verdicts = feed(gate, [SPEECH, HOVER, HOVER, HOVER, SPEECH, SPEECH, SPEECH])
    assert verdicts == [Verdict.PAUSE, None, None, Verdict.RESUME, None, None, Verdict.CONFIRM]


def test_a_window_between_the_pause_threshold_and_the_threshold_pauses_but_does_not_count_as_speech():
    gate = BargeInGate(BargeInRules(pause_threshold=0.3, min_speech_ms=100.0))
    assert feed(gate, [0.2], start_at=1.0) == [None]  # under the pause threshold: nothing
    verdicts = feed(gate, [HOVER, SPEECH, SPEECH, SPEECH, SPEECH], start_at=1.032)
    # the hover window pauses; the 4 windows over the threshold after it (128 ms) confirm, not 3 (96 + 32)
    assert verdicts == [Verdict.PAUSE, None, None, None, Verdict.CONFIRM]
    assert gate.onset_at == 1.032


def test_a_weak_window_that_speech_does_not_follow_is_a_false_pause():
    gate = BargeInGate(BargeInRules(pause_threshold=0.3, max_false_pauses=1))
    assert feed(gate, [HOVER, HOVER, QUIET, QUIET]) == [Verdict.PAUSE, None, None, Verdict.RESUME]
    # past the bound a weak window neither pauses nor counts as a withheld onset: it is not speech
    assert feed(gate, [HOVER, QUIET]) == [None, None]
    assert feed(gate, [SPEECH]) == [Verdict.WITHHELD]


def test_a_weak_window_starts_nothing_when_there_is_no_agent_audio_to_pause():
    gate = BargeInGate(BargeInRules(pause_threshold=0.3, min_speech_ms=100.0))
    assert feed(gate, [HOVER, HOVER], playing=False) == [None, None]
    assert gate.onset_at is None  # no candidate: the session's VAD would not have seen speech start
    assert BargeInGate(BargeInRules(pause_threshold=0.3, pause=False)).push(
        HOVER, at=0.0, agent_playing=True, reply="r1") is None


def test_after_max_false_pauses_in_a_reply_onsets_do_not_pause_it_but_held_speech_still_cancels():
    gate = BargeInGate(BargeInRules(max_false_pauses=2))
    assert feed(gate, [SPEECH, QUIET, QUIET, SPEECH, QUIET, QUIET]) == [Verdict.PAUSE, None, Verdict.RESUME] * 2
    assert feed(gate, [SPEECH, QUIET]) == [Verdict.WITHHELD, None]  # noise: the reply goes on unpaused
    assert feed(gate, [SPEECH, SPEECH, SPEECH, SPEECH]) == [Verdict.WITHHELD, None, None, Verdict.CONFIRM]
    # a new reply gets its pauses back
    assert feed(gate, [QUIET] * 10, reply="r2") == [None] * 10
    assert feed(gate, [SPEECH], reply="r2") == [Verdict.PAUSE]


def test_without_pausing_only_held_speech_acts():
    gate = BargeInGate(BargeInRules(pause=False, min_speech_ms=100.0))
    assert feed(gate, [SPEECH, QUIET, SPEECH, SPEECH, SPEECH, SPEECH]) == [None] * 5 + [Verdict.CONFIRM]


def test_a_one_window_minimum_confirms_at_once_without_a_pause():
    gate = BargeInGate(BargeInRules(min_speech_ms=32.0))
    assert feed(gate, [SPEECH]) == [Verdict.CONFIRM]


def test_speech_that_began_before_the_agent_spoke_neither_pauses_nor_cancels_it():
    """A reply the model started over the caller (Moshi's backchannel) is the model's to make."""
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, silence_ms=96.0))
    assert feed(gate, [SPEECH, SPEECH], playing=False) == [None, None]
    assert feed(gate, [SPEECH, SPEECH, QUIET, SPEECH]) == [None] * 4  # the agent plays now; the caller talks on
    # once the caller's speech has ended (96 ms below the release), a new onset over the agent pauses it
    assert feed(gate, [QUIET, QUIET, QUIET, SPEECH]) == [None, None, None, Verdict.PAUSE]


def test_release_forgets_the_pause_but_not_the_candidate():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    assert feed(gate, [SPEECH]) == [Verdict.PAUSE]
    gate.release()  # the playout was cleared under it
    assert not gate.paused
    assert feed(gate, [QUIET]) == [None]  # no resume: nothing is paused; and no false pause counted
    assert feed(gate, [SPEECH, SPEECH, SPEECH, SPEECH]) == [Verdict.PAUSE, None, None, Verdict.CONFIRM]


def half_step(gate: BargeInGate, probability: float, *, playing: bool = True, reply: str = "r1",
              at: float = 0.0) -> Verdict | None:
    return gate.push(probability, at=at, agent_playing=playing, reply=reply, half_step=True)


def test_an_offset_grid_window_pauses_sooner_and_the_main_windows_alone_count_the_speech():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    assert half_step(gate, QUIET) is None
    assert half_step(gate, SPEECH, at=2.016) is Verdict.PAUSE
    assert gate.paused and gate.onset_at == 2.016
    assert half_step(gate, SPEECH) is None  # no more: the candidate is the main grid's to grow
    # 4 main windows over the threshold, as the session's VAD counts them, confirm it; none sooner
    assert feed(gate, [SPEECH, SPEECH, SPEECH, SPEECH]) == [None, None, None, Verdict.CONFIRM]


def test_an_offset_grid_pause_the_main_window_drops_resumes_and_counts_as_a_false_pause():
    gate = BargeInGate(BargeInRules(max_false_pauses=1))
    assert half_step(gate, SPEECH) is Verdict.PAUSE
    assert feed(gate, [HOVER, QUIET, QUIET]) == [None, None, Verdict.RESUME]
    # the bound holds for offset windows too: no pause, and the withheld onset is counted once, by the main grid
    assert half_step(gate, SPEECH) is None
    assert feed(gate, [SPEECH]) == [Verdict.WITHHELD]


def test_an_offset_grid_window_never_pauses_when_the_main_grid_would_not():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, silence_ms=96.0))
    assert half_step(gate, SPEECH, playing=False) is None  # no agent audio: nothing to pause
    assert feed(gate, [SPEECH, SPEECH, SPEECH, SPEECH], playing=False) == [None] * 4  # the caller's own speech
    assert half_step(gate, SPEECH) is None  # the agent plays now, over the caller's held speech
    assert half_step(BargeInGate(BargeInRules(pause=False)), SPEECH) is None


def levelled(gate: BargeInGate, windows: list[tuple[float, float]]) -> list[Verdict | None]:
    """Windows as (probability, level in dBFS)."""
    return [gate.push(p, at=0.032 * i, agent_playing=True, reply="r1", level_db=level)
            for i, (p, level) in enumerate(windows)]


def test_windows_scored_as_speech_but_30_db_under_the_onsets_loudest_do_not_count_toward_it():
    """Opus's ring-down after a grunt: Silero scores it as speech, 40-60 dB under the grunt."""
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    tail = [(SPEECH, -20.0), (SPEECH, -45.0), (SPEECH, -55.0), (SPEECH, -62.0), (QUIET, -80.0), (QUIET, -80.0)]
    # -45 is within the span and counts; the two under it neither count nor end the onset
    assert levelled(gate, tail) == [Verdict.PAUSE, None, None, None, None, Verdict.RESUME]
    # speech that stays within the span confirms at the minimum, even as it fades 25 dB
    speech = [(SPEECH, -20.0), (SPEECH, -30.0), (SPEECH, -40.0), (SPEECH, -45.0)]
    assert levelled(gate, speech) == [Verdict.PAUSE, None, None, Verdict.CONFIRM]


def test_the_span_is_measured_from_the_loudest_window_so_far_and_a_new_onset_starts_afresh():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    # a soft first window, then a vowel 40 dB louder: both count (the peak was not known yet)
    assert levelled(gate, [(SPEECH, -60.0), (SPEECH, -20.0), (HOVER, -10.0), (SPEECH, -45.0)]) == [
        Verdict.PAUSE, None, None, None]  # the hover window raised the peak to -10: -45 does not count
    assert levelled(gate, [(SPEECH, -38.0), (SPEECH, -39.0)]) == [None, Verdict.CONFIRM]
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    assert levelled(gate, [(SPEECH, -10.0), (QUIET, -80.0), (QUIET, -80.0)]) == [Verdict.PAUSE, None, Verdict.RESUME]
    # the next onset is judged against its own loudest window, not the last one's
    assert levelled(gate, [(SPEECH, -50.0)] * 4) == [Verdict.PAUSE, None, None, Verdict.CONFIRM]


def level_onset(gate: BargeInGate, *, playing: bool = True, reply: str = "r1", at: float = 0.0) -> Verdict | None:
    return gate.push_level_onset(at=at, agent_playing=playing, reply=reply)


def test_a_rise_in_the_callers_level_pauses_before_any_window_and_the_main_windows_count_the_speech():
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    assert level_onset(gate, at=3.01) is Verdict.PAUSE
    assert gate.paused and gate.onset_at == 3.01
    assert level_onset(gate) is None and half_step(gate, SPEECH) is None  # one candidate: no second pause
    assert levelled(gate, [(SPEECH, -20.0)] * 4) == [None, None, None, Verdict.CONFIRM]


def test_a_level_pause_holds_through_loud_windows_scored_as_not_speech_for_the_grace_then_resumes():
    """An "s" before a vowel: Silero scores its windows low while it is loud."""
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, level_grace_ms=96.0))
    assert level_onset(gate) is Verdict.PAUSE
    # two loud windows scored low are inside the grace; the vowel's four windows confirm
    assert levelled(gate, [(QUIET, -30.0), (QUIET, -30.0)] + [(SPEECH, -20.0)] * 4) == [None] * 5 + [Verdict.CONFIRM]
    # a loud sound Silero never calls speech (a cough) drops at its first low window past the grace,
    # and the agent resumes a window later
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, level_grace_ms=96.0))
    assert level_onset(gate) is Verdict.PAUSE
    assert levelled(gate, [(QUIET, -25.0)] * 5) == [None, None, None, Verdict.RESUME, None]


def test_a_level_pause_resumes_at_the_first_quiet_window_and_counts_toward_the_bound():
    """A knock that has died away: the grace is for loud windows only."""
    gate = BargeInGate(BargeInRules(max_false_pauses=1))
    assert level_onset(gate) is Verdict.PAUSE
    assert levelled(gate, [(QUIET, -70.0), (QUIET, -70.0)]) == [None, Verdict.RESUME]
    assert level_onset(gate) is None  # past the bound: no pause for this reply
    assert level_onset(gate, reply="r2") is Verdict.PAUSE  # a new reply gets its pauses back


def test_a_level_onset_pauses_only_where_a_window_could():
    assert level_onset(BargeInGate(), playing=False) is None  # no agent audio to pause
    assert level_onset(BargeInGate(BargeInRules(pause=False))) is None
    assert level_onset(BargeInGate(BargeInRules(level_onset=False))) is None
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, silence_ms=96.0))
    assert feed(gate, [SPEECH] * 4, playing=False) == [None] * 4  # the caller's own speech
    assert level_onset(gate) is None  # the agent plays now, over the caller's held speech
    # a candidate a window began is not taken over: windows under the release drop it as before
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0))
    assert half_step(gate, SPEECH) is Verdict.PAUSE
    assert level_onset(gate) is None
    assert levelled(gate, [(QUIET, -30.0), (QUIET, -30.0)]) == [None, Verdict.RESUME]


def test_a_stop_consonants_closure_inside_a_word_keeps_the_pause_and_its_onset():
    """ "stop": the "s" (a level onset, scored low), the "t" closure (quiet), then the vowel."""
    gate = BargeInGate(BargeInRules(min_speech_ms=100.0, level_grace_ms=96.0))
    assert level_onset(gate, at=5.0) is Verdict.PAUSE
    # the closure drops the candidate; the vowel's first window, within the hold, goes on with the pause
    assert levelled(gate, [(QUIET, -35.0), (QUIET, -60.0)]) == [None, None]
    assert levelled(gate, [(SPEECH, -20.0)] * 4) == [None, None, None, Verdict.CONFIRM]
    assert gate.onset_at == 5.0  # the barge-in counts from the "s", where the caller began


def test_sound_on_the_offset_grid_or_a_level_rise_within_the_hold_goes_on_with_the_pause():
    for again in (lambda gate: half_step(gate, SPEECH), lambda gate: level_onset(gate)):
        gate = BargeInGate(BargeInRules(min_speech_ms=100.0, max_false_pauses=1))
        assert feed(gate, [SPEECH, QUIET], start_at=1.0) == [Verdict.PAUSE, None]
        assert again(gate) is None and gate.paused  # no second pause, no resume in between
        assert feed(gate, [SPEECH] * 4) == [None, None, None, Verdict.CONFIRM]
        assert gate.onset_at == 1.0


def test_a_pause_kept_across_candidates_still_lasts_at_most_max_pause_ms():
    gate = BargeInGate(BargeInRules(max_pause_ms=160.0, min_speech_ms=500.0))
    # a sound that keeps stopping and starting (a rattle) never confirms: past the bound, the first
    # window that does not grow the speech resumes the agent
    verdicts = feed(gate, [SPEECH, QUIET, SPEECH, QUIET, SPEECH, QUIET, SPEECH])
    assert verdicts == [Verdict.PAUSE, None, None, None, None, Verdict.RESUME, Verdict.PAUSE]


def test_speech_growing_past_the_bound_confirms_without_letting_the_agent_out():
    """ "actually no" in one voice: "a", a closure the hold bridges, then "ually" whose windows
    confirm a little past max_pause_ms: the agent stays paused until the barge-in."""
    gate = BargeInGate(BargeInRules(max_pause_ms=128.0, min_speech_ms=100.0))
    verdicts = feed(gate, [SPEECH, SPEECH, QUIET, SPEECH, SPEECH, SPEECH, SPEECH])
    assert verdicts == [Verdict.PAUSE, None, None, None, None, None, Verdict.CONFIRM]
