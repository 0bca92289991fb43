"""The call rounds' report: verdicts worked out as data from a run's figures, then printed.

``judge(run)`` is pure: which rounds are left out and why, each round's figures per call beside the
echo floor and the control checkout, growth from the smallest to the largest N (linearity), the
per-call target, the pooled barge-in histogram. ``print_report`` only formats what ``judge`` found.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import Enum

from bench.call_figures import FLOORS, Round, Run, is_control, kind, over_livekit, per_call
from bench.report import Report
from bench.stats import histogram_quantile, percentile, summary
from bench.worker_profile import WAITING

#: What each path is held to: % of a core per call, the targets the paths were built to; echo is the floor.
TARGET_PER_CALL = {"direct": 3.5, "livekit": 2.0}
#: Per call at the largest N over per call at the smallest: "linear" means within this.
LINEAR_WITHIN = 1.1

DESCRIBE = {
    "direct": "direct worker (aiortc peers)",
    "livekit": "LiveKit worker (livekit SDK; loopback server's CPU left out)",
    "echo": "bare aiortc echo peer (transport floor)",
    "livekit-echo": "bare livekit.rtc tone agent (LiveKit barge-in floor)",
}


def describe(path: str) -> str:
    return DESCRIBE[kind(path)] + (" [control checkout]" if is_control(path) else "")


# ---------------------------------------------------------------- verdicts, as data


@dataclass(frozen=True)
class RoundLine:
    """One round's figures per call, beside the floor and the control at the same N."""

    round: Round
    per_call: float  # % of a core
    over_floor: float | None  # per call over the echo peer's per call; None: no floor to compare
    over_control: float | None  # per call over the control checkout's per call; None: no control
    native_per_call: float | None  # None: no native threads' CPU seen
    end_of_turn_per_call: float | None  # None: no end-of-turn inferences' CPU seen
    saturated: bool
    starved: bool


class LeftOut(Enum):
    NOT_SERVED = "not every call was served in the window"
    SATURATED = "the machine was saturated"


@dataclass(frozen=True)
class Exclusion:
    """A round kept out of its path's verdicts, and why."""

    round: Round
    why: LeftOut


@dataclass(frozen=True)
class Linearity:
    """Per call at the largest measured N over per call at the smallest."""

    small: Round
    large: Round
    growth: float  # nan where the smaller round's figure is not positive
    linear: bool


@dataclass(frozen=True)
class TargetVerdict:
    """Per call at the largest measured N against the path's target."""

    target: float
    sessions: int
    per_call: float
    met: bool
    without_end_of_turn: float | None = None  # per call less the end-of-turn model's inferences
    met_without_end_of_turn: bool | None = None


@dataclass(frozen=True)
class PathVerdict:
    path: str
    left_out: tuple[Exclusion, ...]
    linearity: Linearity | None  # None: no round of the path was measured
    target: TargetVerdict | None  # None: the path has no target, or no round was measured


@dataclass(frozen=True)
class ContextLine:
    """Where the rest of the machine's CPU went in a round, and what its callers saw."""

    round: Round
    rest_cores: float  # machine less worker, server and callers
    heard_stop_p50_ms: float
    reply_heard_p50_ms: float
    end_of_turn_inferences_per_call_minute: float


@dataclass(frozen=True)
class PooledBargeIn:
    """A path's barge-in histogram summed over its measured rounds."""

    path: str
    p50_ms: float
    p95_ms: float
    within_80ms: float  # share
    count: int
    heard_stop_ms: tuple[float, ...]


@dataclass(frozen=True)
class BargeInFloor:
    """LiveKit barge-in as the callers heard it at one call count: ours and the bare agent's (p50, p95)."""

    sessions: int
    ours_ms: tuple[float, float]
    floor_ms: tuple[float, float]
    ours_n: int
    floor_n: int
    saturated: int  # rounds of these on a saturated machine
    rounds: int

    @property
    def beyond_ms(self) -> tuple[float, float]:
        return self.ours_ms[0] - self.floor_ms[0], self.ours_ms[1] - self.floor_ms[1]


@dataclass(frozen=True)
class Verdicts:
    lines: tuple[RoundLine, ...]  # by N, then in the order the rounds ran
    paths: tuple[PathVerdict, ...]
    context: tuple[ContextLine, ...]
    barge_ins: tuple[PooledBargeIn, ...]
    profiled: tuple[Round, ...]
    caller_errors: tuple[tuple[str, int, str], ...]  # (path, calls, error), the first five
    livekit_floors: tuple[BargeInFloor, ...] = ()


def by_calls(rounds: list[Round]) -> list[Round]:
    """Rounds by their call count, in the order they ran within one count."""
    return sorted(rounds, key=lambda r: r.sessions)


def _cores_per_call(cores: float, r: Round) -> float | None:
    return 100 * cores / max(1, r.serving or r.sessions) if cores > 0 else None


def round_lines(run: Run) -> list[RoundLine]:
    floor = {r.sessions: per_call(r, run.idle) for r in run.rounds if r.path == "echo"}
    control = {(kind(r.path), r.sessions): per_call(r, run.idle) for r in run.rounds if is_control(r.path)}
    lines = []
    for r in by_calls(run.rounds):
        per = per_call(r, run.idle)
        below = floor.get(r.sessions, 0.0) if r.path != "echo" else 0.0
        mine = control.get((kind(r.path), r.sessions)) if not is_control(r.path) else None
        lines.append(RoundLine(
            round=r, per_call=per, over_floor=per / below if below > 0 else None,
            over_control=per / mine if mine else None,
            native_per_call=_cores_per_call(r.native_cores, r),
            end_of_turn_per_call=_cores_per_call(r.end_of_turn_cores, r),
            saturated=r.saturated(run.cores), starved=r.starved))
    return lines


def left_out(run: Run, path: str) -> list[Exclusion]:
    return [Exclusion(r, LeftOut.NOT_SERVED if not r.complete else LeftOut.SATURATED)
            for r in run.rounds if r.path == path and not r.measured(run.cores)]


def linearity(measured: list[Round], idle: dict[str, float]) -> Linearity | None:
    """Growth from the smallest to the largest of a path's measured rounds (one round: 1x)."""
    if not measured:
        return None
    ordered = by_calls(measured)
    small, large = ordered[0], ordered[-1]
    base = per_call(small, idle)
    growth = per_call(large, idle) / base if base > 0 else float("nan")
    return Linearity(small, large, growth, linear=growth <= LINEAR_WITHIN)


def target_verdict(large: Round, idle: dict[str, float]) -> TargetVerdict | None:
    target = TARGET_PER_CALL.get(kind(large.path))
    if target is None:
        return None
    per = per_call(large, idle)
    if not large.end_of_turn_cores > 0:
        return TargetVerdict(target, large.sessions, per, met=per <= target)
    without = per - 100 * large.end_of_turn_cores / large.sessions
    return TargetVerdict(target, large.sessions, per, met=per <= target, without_end_of_turn=without,
                         met_without_end_of_turn=without <= target)


def path_verdict(run: Run, path: str) -> PathVerdict:
    measured = [r for r in run.rounds if r.path == path and r.measured(run.cores)]
    growth = linearity(measured, run.idle)
    return PathVerdict(path, tuple(left_out(run, path)), growth,
                       target_verdict(growth.large, run.idle) if growth is not None else None)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def context_line(r: Round) -> ContextLine:
    rest = r.machine_cores - r.worker_cores - r.server_cores - r.callers_cores
    inferences = r.end_of_turn_inferences / r.sessions / (r.took_s / 60) if r.took_s else float("nan")
    return ContextLine(r, rest, _median(r.heard_stop_ms), _median(r.reply_after_ms), inferences)


def pooled_barge_in(run: Run, path: str) -> PooledBargeIn | None:
    mine = [r for r in run.rounds if r.path == path and r.barge_ins and r.measured(run.cores)]
    if not mine:
        return None
    buckets: dict[float, float] = {}
    for r in mine:
        for le, count in r.barge_in.items():
            buckets[le] = buckets.get(le, 0.0) + count
    total = max(buckets.values())
    return PooledBargeIn(path, histogram_quantile(buckets, 50), histogram_quantile(buckets, 95),
                         buckets.get(80.0, 0.0) / max(1.0, total), int(total),
                         tuple(v for r in mine for v in r.heard_stop_ms))


def judge(run: Run) -> Verdicts:
    pooled = (pooled_barge_in(run, path) for path in run.paths)
    return Verdicts(
        lines=tuple(round_lines(run)),
        paths=tuple(path_verdict(run, path) for path in run.paths),
        context=tuple(context_line(r) for r in by_calls(run.rounds)),
        barge_ins=tuple(p for p in pooled if p is not None),
        profiled=tuple(r for r in run.rounds if r.profile),
        caller_errors=tuple((r.path, r.sessions, e) for r in run.rounds for e in r.caller_errors)[:5],
        livekit_floors=tuple(livekit_barge_in_floors(run)))


def livekit_barge_in_floors(run: Run) -> list[BargeInFloor]:
    """Barge-in as the LiveKit callers heard it (onset sent -> the agent heard to stop), the worker beside
    the bare livekit.rtc agent through the same server in the same run, per call count."""
    floors = []
    for sessions in sorted({r.sessions for r in run.rounds}):
        mine = [r for r in run.rounds if r.sessions == sessions and over_livekit(r.path)
                and not is_control(r.path) and r.complete]  # a --control worker is not ours
        heard = {p: [v for r in mine if kind(r.path) == p for v in r.heard_stop_ms] for p in ("livekit", "livekit-echo")}
        if heard["livekit"] and heard["livekit-echo"]:
            floors.append(BargeInFloor(sessions, _percentiles(heard["livekit"]), _percentiles(heard["livekit-echo"]),
                                       len(heard["livekit"]), len(heard["livekit-echo"]),
                                       sum(r.saturated(run.cores) for r in mine), len(mine)))
    return floors


def _percentiles(values: list[float]) -> tuple[float, float]:
    return percentile(values, 50), percentile(values, 95)


def median_per_call(run: Run, path: str, sessions: int) -> tuple[float, int, bool]:
    """The median % of a core per call over a path's measured rounds at ``sessions`` calls, how many rounds,
    and whether those were only rounds on a saturated machine (taken when no other was complete)."""
    rounds = [r for r in run.rounds if r.path == path and r.sessions == sessions and r.complete]
    measured = [r for r in rounds if r.measured(run.cores)]
    mine = [per_call(r, run.idle) for r in (measured or rounds)]
    return (statistics.median(mine) if mine else float("nan")), len(mine), bool(mine) and not measured


SATURATED_NOTE = "the machine was saturated in these rounds: the calls did less than their share, so this reads low"


def add_figures(report: Report, run: Run, verdicts: Verdicts) -> None:
    """The run's headline figures into ``report``: LiveKit barge-in beside the bare livekit.rtc agent, and
    CPU per call at the smallest call count beside the floor the run has (direct beside LiveKit, else echo)."""
    if verdicts.livekit_floors:
        floor = verdicts.livekit_floors[0]
        note = f"the machine was saturated in {floor.saturated} of {floor.rounds} rounds" if floor.saturated else ""
        for i, q in enumerate((50, 95)):
            report.add(f"livekit.bargein_heard_p{q}", f"barge-in as a LiveKit caller hears it, p{q}, {floor.sessions} "
                       "call(s) through the loopback SFU; floor: a bare livekit.rtc agent", floor.ours_ms[i],
                       floor=floor.floor_ms[i], unit="ms", n=floor.ours_n, area="barge-in", note=note)
    counts = sorted({r.sessions for r in run.rounds})
    if not counts:
        return
    n = counts[0]
    paths = {kind(p) for p in run.paths if not is_control(p)}
    pairs = [("livekit.cpu_per_call", "livekit", "direct", "the direct WebRTC worker in the same run")] \
        if {"livekit", "direct"} <= paths else []
    if "echo" in paths:
        pairs += [(f"{path}.cpu_per_call_vs_echo", path, "echo", "bare aiortc echo peers in the same run")
                  for path in sorted(paths - set(FLOORS))]
    for figure, path, below, floor_name in pairs:
        ours, rounds, saturated = median_per_call(run, path, n)
        floor_value, _, floor_saturated = median_per_call(run, below, n)
        left_out = " (the SFU's own CPU left out)" if path == "livekit" else ""
        report.add(figure, f"worker CPU per call, {path}{left_out}, {n} calls; floor: {floor_name}", ours,
                   floor=floor_value, unit="% of a core", n=rounds, compare="ratio", area="CPU",
                   note=SATURATED_NOTE if saturated or floor_saturated else "")


# ---------------------------------------------------------------- printing


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _cell(value: float | None, width: int) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def line_notes(line: RoundLine, cores: int) -> list[str]:
    r = line.round
    notes = [r.note] if r.note else []
    if line.saturated:
        notes.append(f"machine saturated: {r.machine_cores:.2f} of {cores} cores busy"
                     + (": left out of the verdicts below" if r.complete else ""))
    if line.starved:
        notes.append("the worker's loop was starved of CPU: it fell behind, so its figure is low")
    if not r.complete:
        notes.append("not every call was up: left out of the verdicts below")
    return notes


def exclusion_text(left: Exclusion, cores: int) -> str:
    r = left.round
    if left.why is LeftOut.NOT_SERVED:
        why = f"{r.serving} of them served in the window ({r.note or 'callers not ready'})"
    else:
        why = (f"the machine was saturated ({r.machine_cores:.2f} of {cores} cores busy), so the calls fell "
               "behind and did less than their share")
    return f"  {describe(r.path)}: {r.sessions} calls not measured: {why}: this machine could not run them all"


def verdict_text(path: str, growth: Linearity, target: TargetVerdict | None) -> str:
    verdict = ""
    if target is not None:
        verdict = (f"; {target.per_call:.2f}% per call at {target.sessions} against a target of <= {target.target}%: "
                   f"{'met' if target.met else 'NOT met'}")
        if target.without_end_of_turn is not None:
            verdict += (f"; without the end-of-turn model's inferences {target.without_end_of_turn:.2f}%: "
                        f"{'met' if target.met_without_end_of_turn else 'NOT met'}")
    return (f"  {describe(path)}: {growth.large.sessions} vs {growth.small.sessions} calls: {growth.growth:.2f}x "
            f"({'linear' if growth.linear else 'NOT linear'}){verdict}")


def print_report(run: Run, verdicts: Verdicts) -> None:
    idle, cores = run.idle, run.cores
    print()
    print("idle, before any call (cores, the least of its windows): "
          + ", ".join(f"{p} {idle[p]:.3f}" for p in run.paths))
    print(f"CPU: psutil cpu_times deltas of each process over a {run.window_s:.0f} s window while every call loops "
          "question -> ~300 ms of reply -> interruption + question ...; per call = (worker cores - its idle) / calls; "
          "of it native = the part in threads a native library started and named (livekit's FFI media: WebRTC, "
          "Opus, tokio), per call, its fixed cost included: what no change in this project's Python can remove; "
          "of it end-of-turn = the end-of-turn model's inferences, per call (the worker's "
          "duplex_end_of_turn_cpu_seconds over the window); "
          "loop waited = share of the window the worker's main thread was runnable but had no CPU (schedstat)")
    print()
    header = (f"{'path':16} | {'calls':>5} | {'worker cores':>12} | {'% core per call':>15} | {'of it native':>12} | "
              f"{'of it end-of-turn':>17} | "
              f"{'x echo floor':>12} | {'x control':>9} | {'loop waited':>11} | {'barge-in p50/p95 ms (n)':>23} | "
              f"{'underruns':>9}")
    print(header)
    print("-" * len(header))
    for line in verdicts.lines:
        r = line.round
        bi = (f"{histogram_quantile(r.barge_in, 50):.0f}/{histogram_quantile(r.barge_in, 95):.0f} ({r.barge_ins})"
              if r.barge_ins else "-")
        count = f"{r.serving}" if r.serving == r.sessions else f"{r.serving}/{r.sessions}"
        notes = line_notes(line, cores)
        print(f"{r.path:16} | {count:>5} | {r.worker_cores:12.3f} | {line.per_call:15.2f} | "
              f"{_cell(line.native_per_call, 12)} | {_cell(line.end_of_turn_per_call, 17)} | "
              f"{_ratio(line.over_floor):>12} | {_ratio(line.over_control):>9} | "
              f"{100 * r.loop_waited:10.0f}% | {bi:>23} | "
              f"{r.underruns if kind(r.path) not in FLOORS else '-':>9}" + (f"   [{'; '.join(notes)}]" if notes else ""))
    for line in run.skipped:
        print(f"(skipped {line})")
    print()
    print("per call at the largest N over per call at the smallest (linear: <= "
          f"{LINEAR_WITHIN:.1f}), and against the target:")
    for verdict in verdicts.paths:
        for left in verdict.left_out:
            print(exclusion_text(left, cores))
        if verdict.linearity is not None:
            print(verdict_text(verdict.path, verdict.linearity, verdict.target))
    print()
    print("context per round (cores over the same window): server = the loopback LiveKit server (left out of the "
          "worker's figure), callers = the callers' process, rest = everything else on the machine (other workers, "
          "this bench, unrelated processes); the callers' view: no reply within 12 s, onset sent -> the agent "
          "heard to stop, question's end sent -> reply heard (500 ms end-of-turn silence included); end-of-turn "
          "inferences = pauses the worker showed its end-of-turn model, per call per minute of the round (their CPU "
          "is the first table's 'of it end-of-turn')")
    header2 = (f"{'path':16} | {'calls':>5} | {'server':>6} | {'callers':>7} | {'rest':>5} | {'machine':>7} | "
               f"{'unanswered':>10} | {'heard stop p50 ms':>17} | {'reply heard p50 ms':>18} | "
               f"{'end-of-turn inferences':>22}")
    print(header2)
    print("-" * len(header2))
    for c in verdicts.context:
        r = c.round
        print(f"{r.path:16} | {r.sessions:>5} | {r.server_cores:6.2f} | {r.callers_cores:7.2f} | "
              f"{c.rest_cores:5.2f} | {r.machine_cores:7.2f} | {r.no_reply:>10} | {c.heard_stop_p50_ms:17.0f} | "
              f"{c.reply_heard_p50_ms:18.0f} | {c.end_of_turn_inferences_per_call_minute:22.1f}")
    for f in verdicts.livekit_floors:
        print(f"LiveKit barge-in as the caller hears it, {f.sessions} calls: ours p50 {f.ours_ms[0]:.0f} / p95 "
              f"{f.ours_ms[1]:.0f} ms (n={f.ours_n}), the bare livekit.rtc agent (floor) p50 {f.floor_ms[0]:.0f} / "
              f"p95 {f.floor_ms[1]:.0f} ms (n={f.floor_n}): ours beyond the floor p50 {f.beyond_ms[0]:+.0f} ms, "
              f"p95 {f.beyond_ms[1]:+.0f} ms"
              + (f" [the machine was saturated in {f.saturated} of these {f.rounds} rounds]" if f.saturated else ""))
    for b in verdicts.barge_ins:
        print(f"barge-in at the {b.path} worker, all measured rounds (its /metrics histogram, interpolated): "
              f"p50 {b.p50_ms:.0f} ms, p95 {b.p95_ms:.0f} ms, {100 * b.within_80ms:.0f}% within 80 ms (n={b.count}); "
              f"the callers heard it stop {summary(list(b.heard_stop_ms), 'ms')}")
    if verdicts.profiled:
        profiled = verdicts.profiled
        print()
        print("where the worker's time goes (py-spy, all threads, share of samples; innermost part named wins; "
              f"'{WAITING}' = a thread woken in a blocking call, runnable but without a CPU yet):")
        parts = sorted({k for r in profiled for k in r.profile},
                       key=lambda k: -max(r.profile.get(k, 0) for r in profiled))
        print(f"  {'part':44}" + "".join(f" | {r.path + ' ' + str(r.sessions):>11}" for r in profiled))
        for part in parts:
            print(f"  {part:44}" + "".join(f" | {100 * r.profile.get(part, 0.0):10.1f}%" for r in profiled))
    if verdicts.caller_errors:
        print(f"caller errors: {list(verdicts.caller_errors)}")
    print()
    print(f"notes: every process shares this machine's {cores} cores, and other developers' jobs ran beside these "
          "rounds ('rest'): compare the paths within one run (same N, same window), not across runs. The loopback "
          "LiveKit server is a Python SFU (aiortc) that forwards audio RTP (RED over Opus, as LiveKit answers) as it "
          "arrives, as LiveKit's does (no jitter buffer, no hold, no decode), at Python's cost per packet.")
