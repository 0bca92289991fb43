"""The soak's summary, printed beside its goals, and its records for bench/results/soak.json."""

from __future__ import annotations

from bench.report import Report
from bench.soak_calls import CallResult
from bench.soak_probe import FIGURES, Sample, growth_per_100_calls
from bench.soak_rig import Worker
from bench.stats import percentile

#: The goals: memory grows under this per 100 calls after warm-up; the late p95s stay within this of the early.
RSS_GOAL_MB = 1.0
LATE_GOAL = 1.10
#: Counts (descriptors, threads, tasks, handles) are whole things: growth of under one per 100 calls
#: is the noise of what happens to be open at a sample, not a leak of one per call.
COUNT_GOAL = 1.0


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def growth(report: Report, samples: dict[str, list[Sample]], workers: list[Worker], warmup_s: float) -> None:
    print(f"\ngrowth after warm-up ({warmup_s:.0f} s), per 100 finished calls of that worker's kind:")
    for worker in workers:
        series = samples.get(worker.name, [])
        for figure, unit in FIGURES.items():
            rate, n = growth_per_100_calls(series, figure, warmup_s)
            if n == 0:
                continue
            steady = [s for s in series if s.t_s >= warmup_s and figure in s.values]
            kept = [s.values[figure] for s in steady]
            calls = steady[-1].calls_done - steady[0].calls_done
            goal = RSS_GOAL_MB if figure == "rss_mb" else COUNT_GOAL
            ok = None if rate is None else rate < goal
            print(f"  {worker.name:15} {figure:12} {'n/a' if rate is None else f'{rate:+8.2f}'} {unit} / 100 calls "
                  f"({kept[0]:.0f} -> {kept[-1]:.0f}, {calls} calls, {n} samples); goal < {goal:g}: {_met(ok)}")
            source = "from its /metrics" if worker.metrics_port is not None else "its process tree, from outside"
            report.add(f"soak.{worker.name}.{figure}_growth", f"soak: the {worker.name} worker's {figure} growth "
                       f"per 100 {worker.serves} calls after warm-up ({source}; goal under {goal:g})", rate,
                       unit=f"{unit}/100 calls", n=n, compare="ratio", area="soak", digits=2,
                       note=f"{calls} calls after warm-up, {n} samples")


def outcomes(report: Report, calls: list[CallResult]) -> None:
    dropped = [c for c in calls if c.dropped]
    questions = sum(c.questions for c in calls)
    unanswered = sum(c.unanswered for c in calls)
    kinds = sorted({c.kind for c in calls})
    print(f"\ncalls: {len(calls)} (" + ", ".join(f"{k} {sum(c.kind == k for c in calls)}" for k in kinds) + ")")
    print(f"  dropped: {len(dropped)}; goal 0: {_met(not dropped)}")
    for call in dropped:
        room = f", room {call.room}-0" if call.room else ""
        print(f"    call {call.index} ({call.kind}{room}, from {call.started_s:.0f} s): {call.dropped}")
    print(f"  questions unanswered: {unanswered} of {questions}; goal 0: {_met(unanswered == 0)}")
    print(f"  connections dropped on purpose and resumed: {sum(c.resumes for c in calls)}")
    for call in calls:
        if call.unanswered:
            print(f"    call {call.index} ({call.kind}, from {call.started_s:.0f} s): {call.unanswered} of "
                  f"{call.questions} unanswered")
    report.add("soak.calls_dropped", "soak: calls dropped (the caller failed, errored or never heard the agent; "
               "goal 0)", len(dropped), unit="calls", n=len(calls), compare="ratio", area="soak")
    report.add("soak.questions_unanswered", "soak: questions the caller heard no reply to within 12 s (goal 0)",
               unanswered, unit="questions", n=questions, compare="ratio", area="soak")


def early_late(report: Report, calls: list[CallResult], warmup_s: float) -> None:
    """p95s of the first third of the calls after warm-up against the last third, by start time."""
    steady = sorted((c for c in calls if c.started_s >= warmup_s and not c.dropped), key=lambda c: c.started_s)
    third = len(steady) // 3
    early, late = steady[:third], steady[len(steady) - third:] if third else []
    print(f"\nlatency as the callers heard it, p95: the first {len(early)} calls after warm-up against the last "
          f"{len(late)}:")
    for name, attr, title in (("turn", "turn_ms", "turn latency (the question's end -> the reply heard)"),
                              ("bargein", "bargein_ms", "barge-in (the interruption's first sound -> quiet)")):
        e = [v for c in early for v in getattr(c, attr)]
        lt = [v for c in late for v in getattr(c, attr)]
        p_early, p_late = percentile(e, 95), percentile(lt, 95)
        ratio = p_late / p_early if e and lt and p_early else None
        print(f"  {name:8} early {p_early:6.0f} ms (n {len(e)}), late {p_late:6.0f} ms (n {len(lt)}): "
              f"{'n/a' if ratio is None else f'{ratio:.2f}x'}; goal <= {LATE_GOAL:.2f}x: "
              f"{_met(None if ratio is None else ratio <= LATE_GOAL)}")
        report.add(f"soak.{name}_p95_late", f"soak: {title}, p95 of the last third of the calls; floor: the first "
                   f"third after warm-up (goal: within 10 %)", p_late if lt else None,
                   floor=p_early if e else None, unit="ms", n=len(lt), compare="ratio", area="soak")


def summarize(report: Report, calls: list[CallResult], samples: dict[str, list[Sample]], workers: list[Worker],
              warmup_s: float) -> None:
    outcomes(report, calls)
    growth(report, samples, workers, warmup_s)
    left = {w.name: samples[w.name][-1].sessions for w in workers if samples.get(w.name)}
    print("\nsessions still open after the last call: "
          + ", ".join(f"{name} {'n/a' if n is None else f'{n:.0f}'}" for name, n in left.items()))
    early_late(report, calls, warmup_s)
