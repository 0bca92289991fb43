"""The rule that tells a frozen host from a slow one, on a virtual clock."""

from __future__ import annotations

import pytest

from duplex_agent.agent.remote.liveness import HostLiveness, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Clock) -> HostLiveness:
    return HostLiveness(probe_after_s=0.5, unresponsive_after_s=1.5, clock=clock)


def run_until(liveness: HostLiveness, clock: Clock, end: float, *, answer_probe_at: float | None = None,
              frames_every: float | None = None) -> list[tuple[float, Verdict]]:
    """Step the clock as a watcher would (to each ``next_check_in``, never further than a frame or an
    answer), feeding frames; the verdicts that were not ALIVE, with when."""
    seen: list[tuple[float, Verdict]] = []
    next_frame = clock.now + frames_every if frames_every else None
    pending_answer: float | None = None
    while clock.now < end:
        stops = [clock.now + max(liveness.next_check_in(), 0.001), end]
        stops += [t for t in (next_frame, pending_answer) if t is not None]
        clock.now = min(stops)
        if next_frame is not None and clock.now >= next_frame:
            liveness.heard()
            next_frame = clock.now + frames_every  # type: ignore[operator]
        if pending_answer is not None and clock.now >= pending_answer:
            liveness.heard()
            pending_answer = None
        verdict = liveness.verdict()
        if verdict is Verdict.PROBE:
            seen.append((round(clock.now, 3), verdict))
            if answer_probe_at is not None:
                pending_answer = max(clock.now, answer_probe_at)
        elif verdict is Verdict.UNRESPONSIVE:
            seen.append((round(clock.now, 3), verdict))
            return seen
    return seen


def test_a_stream_that_keeps_coming_is_never_probed():
    clock = Clock()
    liveness = watch(clock)
    assert run_until(liveness, clock, 130.0, frames_every=0.1) == []


def test_a_host_that_falls_silent_is_probed_then_given_up_at_the_bound():
    clock = Clock()
    liveness = watch(clock)
    seen = run_until(liveness, clock, 110.0)
    assert seen == [(100.5, Verdict.PROBE), (101.5, Verdict.UNRESPONSIVE)]


def test_a_quiet_host_that_answers_its_probes_stays_alive_and_is_probed_once_per_quiet_spell():
    clock = Clock()
    liveness = watch(clock)
    seen = []
    for _ in range(20):  # every probe answered a millisecond later
        seen += run_until(liveness, clock, clock.now + 0.6, answer_probe_at=-1)
    assert seen and {verdict for _, verdict in seen} == {Verdict.PROBE}
    assert all(b - a >= 0.5 for (a, _), (b, _) in zip(seen, seen[1:], strict=False))


@pytest.mark.parametrize("pause_starts_after", [0.0, 0.25, 0.5, 0.75])
def test_a_half_second_pause_anywhere_in_a_quiet_spell_is_forgiven(pause_starts_after):
    """The host freezes for 500 ms (a garbage collection): nothing it owes arrives before it wakes,
    then everything does. Whenever that falls, the host is never given up."""
    clock = Clock()
    liveness = watch(clock)
    wakes = clock.now + pause_starts_after + 0.5
    seen = run_until(liveness, clock, clock.now + 5.0, answer_probe_at=wakes)
    assert Verdict.UNRESPONSIVE not in {verdict for _, verdict in seen}, seen


def test_a_frozen_host_is_given_up_within_the_bound_of_its_last_frame_whenever_it_froze():
    for froze_after in (0.0, 0.3, 0.49, 0.51, 1.2):
        clock = Clock()
        liveness = watch(clock)
        start = clock.now
        run_until(liveness, clock, start + froze_after, answer_probe_at=-1)  # answers until it freezes
        last_heard = clock.now - liveness.silent_s
        seen = run_until(liveness, clock, start + 10.0)
        assert seen[-1][1] is Verdict.UNRESPONSIVE
        assert seen[-1][0] == pytest.approx(last_heard + 1.5, abs=0.01), (froze_after, seen)


def test_a_stall_of_this_sides_own_loop_is_not_taken_for_a_silent_host():
    """The watcher wakes two seconds late (this side's loop was busy): the host is asked first, and
    given its whole answer window, before it can be given up."""
    clock = Clock()
    liveness = watch(clock)
    clock.now += 2.0
    assert liveness.verdict() is Verdict.PROBE
    clock.now += 0.9
    assert liveness.verdict() is Verdict.ALIVE
    assert liveness.next_check_in() == pytest.approx(0.1)
    clock.now += 0.1
    assert liveness.verdict() is Verdict.UNRESPONSIVE


def test_the_probe_must_have_time_to_be_answered():
    with pytest.raises(ValueError):
        HostLiveness(probe_after_s=1.5, unresponsive_after_s=1.5, clock=Clock())
