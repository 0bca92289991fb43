"""The call rounds' verdicts, worked out from constructed rounds: no process, no call."""

import math

import pytest

from bench.call_figures import Round, Run, per_call
from bench.call_report import LeftOut, judge, linearity, print_report, target_verdict

CORES = 2


def served(path: str, calls: int, worker_cores: float, **figures) -> Round:
    """A round with every call up and the machine not saturated, unless ``figures`` say otherwise."""
    figures.setdefault("machine_cores", 1.2)
    return Round(path, calls, serving=calls, ready=True, worker_cores=worker_cores, **figures)


def run_of(*rounds: Round, idle: dict[str, float] | None = None) -> Run:
    paths = tuple(dict.fromkeys(r.path for r in rounds))
    return Run(paths, window_s=8.0, cores=CORES, idle=idle or dict.fromkeys(paths, 0.0), rounds=list(rounds))


def verdict_for(verdicts, path: str):
    return next(v for v in verdicts.paths if v.path == path)


def test_per_call_takes_the_idle_worker_off_and_divides_by_the_calls_served():
    r = Round("direct", 8, serving=6, ready=True, worker_cores=0.32)
    assert per_call(r, {"direct": 0.02}) == pytest.approx(5.0)  # (0.32 - 0.02) / 6 calls
    assert per_call(Round("direct", 8, worker_cores=0.32), {}) == pytest.approx(4.0)  # none served: by the calls asked


def test_linearity_is_per_call_at_the_largest_n_over_the_smallest():
    idle = {"direct": 0.04}
    flat = linearity([served("direct", 16, 0.52), served("direct", 4, 0.16), served("direct", 8, 0.30)], idle)
    assert (flat.small.sessions, flat.large.sessions) == (4, 16)
    assert flat.growth == pytest.approx(1.0)  # 3 % a call at 4 and at 16
    assert flat.linear
    steep = linearity([served("direct", 4, 0.16), served("direct", 16, 0.61)], idle)
    assert steep.growth == pytest.approx(3.5625 / 3.0)
    assert not steep.linear
    idle_only = linearity([served("direct", 4, 0.04), served("direct", 16, 0.5)], idle)
    assert math.isnan(idle_only.growth) and not idle_only.linear  # nothing per call at 4 to grow from
    assert linearity([], idle) is None


def test_the_target_is_judged_at_the_largest_measured_round():
    met = target_verdict(served("direct", 16, 0.48), {})
    assert met.target == 3.5 and met.per_call == pytest.approx(3.0) and met.met
    assert met.without_end_of_turn is None
    missed = target_verdict(served("livekit", 16, 0.48), {})
    assert missed.target == 2.0 and not missed.met
    assert target_verdict(served("echo", 16, 0.48), {}) is None  # the floor has no target


def test_the_target_without_the_end_of_turn_model_takes_its_cores_off():
    verdict = target_verdict(served("direct", 16, 0.64, end_of_turn_cores=0.16), {})
    assert verdict.per_call == pytest.approx(4.0) and not verdict.met
    assert verdict.without_end_of_turn == pytest.approx(3.0) and verdict.met_without_end_of_turn


def test_a_saturated_round_is_left_out_of_linearity_target_and_pooled_barge_in():
    """The 16-call round read 1 % a call only because the machine had no CPU left to do its work."""
    run = run_of(
        served("direct", 4, 0.12, barge_in={40.0: 3.0, 80.0: 4.0, math.inf: 4.0}),
        served("direct", 8, 0.24, barge_in={40.0: 1.0, 80.0: 2.0, math.inf: 2.0}),
        served("direct", 16, 0.16, machine_cores=1.95, barge_in={40.0: 0.0, 80.0: 0.0, math.inf: 9.0}))
    verdicts = judge(run)
    direct = verdict_for(verdicts, "direct")
    assert [(e.round.sessions, e.why) for e in direct.left_out] == [(16, LeftOut.SATURATED)]
    assert (direct.linearity.small.sessions, direct.linearity.large.sessions) == (4, 8)
    assert direct.linearity.growth == pytest.approx(1.0) and direct.linearity.linear
    assert direct.target.sessions == 8 and direct.target.per_call == pytest.approx(3.0) and direct.target.met
    [pooled] = verdicts.barge_ins
    assert pooled.count == 6 and pooled.within_80ms == pytest.approx(1.0)  # the saturated round's 9 left out
    assert [line.saturated for line in verdicts.lines] == [False, False, True]


def test_a_round_not_every_call_was_served_in_is_left_out():
    run = run_of(served("livekit", 4, 0.08),
                 Round("livekit", 16, serving=15, ready=True, worker_cores=0.15, machine_cores=1.2),
                 Round("livekit", 8, serving=0, ready=False, worker_cores=0.01, machine_cores=1.0))
    livekit = verdict_for(judge(run), "livekit")
    assert [(e.round.sessions, e.why) for e in livekit.left_out] == [(16, LeftOut.NOT_SERVED), (8, LeftOut.NOT_SERVED)]
    assert livekit.linearity.small is livekit.linearity.large  # only the 4-call round: 1x
    assert livekit.target.sessions == 4


def test_a_path_with_no_measured_round_has_no_verdict():
    livekit = verdict_for(judge(run_of(served("livekit", 4, 0.1, machine_cores=1.9))), "livekit")
    assert livekit.linearity is None and livekit.target is None and len(livekit.left_out) == 1


def test_each_round_is_set_beside_the_echo_floor_and_the_control_at_the_same_n():
    run = run_of(served("direct", 4, 0.20), served("direct@control", 4, 0.10), served("echo", 4, 0.05),
                 served("direct", 8, 0.40, loop_waited=0.4), served("direct@control", 8, 0.0))
    lines = {(line.round.path, line.round.sessions): line for line in judge(run).lines}
    assert [(line.round.path, line.round.sessions) for line in judge(run).lines][:3] == [
        ("direct", 4), ("direct@control", 4), ("echo", 4)]  # by N, then as they ran
    assert lines["direct", 4].over_floor == pytest.approx(4.0)
    assert lines["direct", 4].over_control == pytest.approx(2.0)
    assert lines["direct@control", 4].over_control is None  # the control is not set beside itself
    assert lines["echo", 4].over_floor is None
    assert lines["direct", 8].over_floor is None  # no floor at 8
    assert lines["direct", 8].over_control is None  # the control's figure was nothing
    assert lines["direct", 8].starved and not lines["direct", 4].starved


def test_the_printed_report_says_what_the_verdicts_found(capsys: pytest.CaptureFixture[str]):
    run = run_of(served("livekit", 4, 0.08), served("livekit", 16, 0.48, end_of_turn_cores=0.16),
                 served("echo", 4, 0.04), served("echo", 16, 0.2, machine_cores=1.9))
    run.skipped.append("32 calls: the run's time budget of 600 s was spent")
    print_report(run, judge(run))
    out = capsys.readouterr().out
    assert ("LiveKit worker (livekit SDK; loopback server's CPU left out): 16 vs 4 calls: 1.50x (NOT linear); "
            "3.00% per call at 16 against a target of <= 2.0%: NOT met; without the end-of-turn model's inferences "
            "2.00%: met\n") in out
    assert "bare aiortc echo peer (transport floor): 4 vs 4 calls: 1.00x (linear)\n" in out
    assert "16 calls not measured: the machine was saturated (1.90 of 2 cores busy)" in out
    assert "(skipped 32 calls: the run's time budget of 600 s was spent)" in out


def test_livekit_barge_in_is_set_beside_the_bare_livekit_agent_at_the_same_n():
    verdicts = judge(run_of(
        served("livekit", 4, 0.4, heard_stop_ms=[300.0, 340.0, 500.0]),
        served("livekit-echo", 4, 0.1, heard_stop_ms=[250.0, 280.0, 300.0]),
        served("livekit", 8, 0.8, heard_stop_ms=[310.0]),  # no floor round at 8: no line
        Round("livekit-echo", 4, serving=3, ready=True, worker_cores=0.1, heard_stop_ms=[9999.0]),  # a call down: out
    ))
    (floor,) = verdicts.livekit_floors
    assert (floor.sessions, floor.ours_n, floor.floor_n) == (4, 3, 3)
    assert floor.ours_ms == (340.0, 500.0) and floor.floor_ms == (280.0, 300.0)
    assert floor.beyond_ms == (60.0, 200.0)


def test_the_run_figures_compare_livekit_with_direct_and_say_when_the_machine_was_saturated():
    from bench.call_report import add_figures
    from bench.report import Report

    calm = run_of(served("livekit", 4, 0.24), served("direct", 4, 0.20))
    report = Report("t", command="python -m bench.livekit_vs_direct --quick")
    add_figures(report, calm, judge(calm))
    (cpu,) = report.records
    assert (cpu["figure"], cpu["value"], cpu["floor"], cpu["ratio"], cpu["n"]) == ("livekit.cpu_per_call", 6.0, 5.0,
                                                                                    1.2, 1)
    assert "note" not in cpu

    busy = run_of(served("livekit", 4, 0.24, machine_cores=2.0), served("direct", 4, 0.20, machine_cores=2.0))
    report = Report("t", command="python -m bench.livekit_vs_direct --quick")
    add_figures(report, busy, judge(busy))
    assert report.records[0]["ratio"] == 1.2 and "saturated" in report.records[0]["note"]
