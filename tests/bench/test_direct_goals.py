"""The direct path's goals (parts a and b of ``bench.direct_path``), judged from constructed figures."""

import math

from bench.direct_path import DirectResult, Trial, direct_goals


def result(*, barge_in: list[float | None], added: list[float], held: list[float], out: list[float],
           work: list[float]) -> DirectResult:
    trials = [Trial("Stop, stop.", 600.0, barge_in_ms=ms) for ms in barge_in]
    return DirectResult(trials=trials, missed=sum(ms is None for ms in barge_in), no_reply=0, input_added=added,
                        output_added=out, input_work=[], input_held=held, output_work=work, output_wait=[],
                        tick_late=[], resets=0, own_cores=0.5, machine_cores=1.0)


def test_the_input_goal_is_what_is_beyond_the_resamplers_hold():
    goals = direct_goals(result(barge_in=[30.0, 50.0, None], added=[6.0, 7.0, 7.5], held=[4.0, 4.0, 4.0],
                                out=[12.0, 19.0], work=[0.4, 0.6]))
    assert goals.input_beyond == (2.0, 3.0, 3.5)
    assert goals.input_beyond_resampler.p95_ms == 3.5 and goals.input_beyond_resampler.met
    assert goals.barge_in.p95_ms == 50.0 and goals.barge_in.met  # the missed trial has no figure
    assert goals.output_added.p95_ms == 19.0 and not goals.output_added.met  # the frame clock's wait counts
    assert goals.output_work.met


def test_a_goal_without_figures_is_not_met():
    goals = direct_goals(result(barge_in=[None, 120.0], added=[6.0], held=[], out=[], work=[]))
    assert goals.input_beyond == ()  # holds that do not pair up with the appends give no figure
    assert math.isnan(goals.input_beyond_resampler.p95_ms) and not goals.input_beyond_resampler.met
    assert not goals.output_added.met
    assert goals.barge_in.p95_ms == 120.0 and not goals.barge_in.met
