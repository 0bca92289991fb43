"""Overload refused, not shared: the calls a saturated worker already has, beside the same calls alone.

Two direct WebRTC workers (``duplex-agent serve``, the reference model by default), the same but for
``--max-cpu``: one refuses new calls while the machine is busier than the limit, one takes every call
up to ``--max-sessions``. Three rounds, each with ``--calls`` callers that keep asking and talking
over the agent (``bench.livekit_callers``, one process):

- ``alone``: those callers only, on the guarded worker: the floor;
- ``crowd``: the same on the guarded worker, and once they are up a crowd of ``--crowd`` more
  callers arriving one every ``--arrival-s`` (a process each, as separate clients), each trying once;
- ``crowd, unguarded``: the same crowd against the worker without the limit.

For the first callers of each round it prints barge-in as they heard it (their onset to the agent
quiet, p95), the reply to a question (end of question to the first sound, p95) and the worker's
underruns per call minute (each call's own figures, from its data channel); for the crowd, how many
were refused; for each round, the machine's busy share. The callers share this machine, so their
own CPU counts toward the share the guard reads, as a model server on the same host would.
Figures go to bench/results/overload.json; the run never passes or fails on them.

Run: python -m bench.overload [--calls 3] [--crowd 6] [--max-cpu 0.8] [--seconds 45] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.call_rig import Service, free_port, scrape, wait_for_metrics, write_speech
from bench.caller_process import CallerProcess
from bench.report import Report
from bench.stats import percentile
from duplex_agent.agent.session.cpu_guard import read_cpu_times

FIRST_CALLERS_PATIENCE_S = 90.0


@dataclass
class Round:
    name: str
    callers: list[dict[str, Any]] = field(default_factory=list)  # the first callers' summaries
    crowd: list[dict[str, Any]] = field(default_factory=list)  # the crowd's
    busy: float | None = None  # the machine's busy share over the round
    seconds: float = 0.0

    def heard_stop_p95(self) -> float | None:
        values = [float(v) for c in self.callers for v in c.get("heard_stop_ms", [])]
        return percentile(values, 95) if values else None

    def reply_p95(self) -> float | None:
        values = [float(v) for c in self.callers for v in c.get("reply_after_ms", [])]
        return percentile(values, 95) if values else None

    def underruns_per_minute(self) -> float | None:
        counts = [c["worker_figures"].get("underruns") for c in self.callers if c.get("worker_figures")]
        counts = [n for n in counts if n is not None]
        if not counts or self.seconds <= 0:
            return None
        return sum(counts) / (len(counts) * self.seconds / 60.0)

    def refused(self) -> int:
        return sum(1 for c in self.crowd if "503" in str(c.get("error") or ""))

    def admitted(self) -> int:
        return sum(1 for c in self.crowd if not c.get("error"))

    def dropped(self) -> int:
        return sum(1 for c in self.callers if c.get("dropped") or c.get("error"))


async def run_round(name: str, url: str, args: argparse.Namespace, speech: str, crowd: bool) -> Round:
    result = Round(name)
    # The first callers wait out a busy worker, as a patient client does: their own start-up can
    # take the machine past the limit. The crowd's callers try once.
    first = await CallerProcess(url, speech, args.seconds + 120, sessions=args.calls,
                                extra=("--busy-retry", str(FIRST_CALLERS_PATIENCE_S))).start()
    crowding: list[CallerProcess] = []
    try:
        await asyncio.wait_for(first.ready.wait(), 120)
        busy0, total0 = read_cpu_times()
        started = time.perf_counter()
        if crowd:
            for _ in range(args.crowd):
                crowding.append(await CallerProcess(url, speech, args.seconds + 120).start())
                await asyncio.sleep(args.arrival_s)
        await asyncio.sleep(max(0.0, args.seconds - (time.perf_counter() - started)))
        busy1, total1 = read_cpu_times()
        result.busy = (busy1 - busy0) / (total1 - total0) if total1 > total0 else None
        result.seconds = time.perf_counter() - started
    finally:
        result.callers = await first.hang_up()
        for process in crowding:
            result.crowd += await process.hang_up()
    return result


async def calm(metrics_port: int, limit: float, timeout_s: float = 120.0) -> None:
    """Until the guarded worker reads the machine under its limit: a round's first callers must be
    admitted (the workers' start-up, or the last round's calls, can hold the machine above it)."""
    deadline, busy = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        figures = await asyncio.to_thread(scrape, metrics_port, tries=1)  # not on the loop reading the callers
        busy = figures.machine_busy if figures is not None else None
        if busy is not None and busy < 0.8 * limit:
            return
        await asyncio.sleep(1.0)
    print(f"   the machine stayed busy (the guarded worker reads {busy})", flush=True)


def start_worker(name: str, port: int, metrics_port: int, args: argparse.Namespace, max_cpu: float,
                 log_dir: Path) -> Service:
    worker = Service(name, [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--plugin", args.plugin,
                            "--port", str(port), "--metrics-port", str(metrics_port),
                            "--max-sessions", str(args.calls + args.crowd), "--max-cpu", str(max_cpu)],
                     log_dir / f"{name}.log", env={"HF_HUB_OFFLINE": "1"})
    worker.start()
    return worker


def report(rounds: dict[str, Round], args: argparse.Namespace) -> None:
    alone, guarded, unguarded = rounds["alone"], rounds["crowd"], rounds["crowd, unguarded"]
    for r in rounds.values():
        busy = "n/a" if r.busy is None else f"{r.busy:.0%}"
        print(f"{r.name:17} machine busy {busy:>4}; first {args.calls} callers: barge-in heard p95 "
              f"{_ms(r.heard_stop_p95())}, reply p95 {_ms(r.reply_p95())}, underruns/call-min "
              f"{_n(r.underruns_per_minute())}, dropped {r.dropped()}, refused first "
              f"{sum(c.get('busy_refusals', 0) for c in r.callers)} times; crowd of {len(r.crowd)}: "
              f"{r.admitted()} admitted, {r.refused()} refused", flush=True)
        for error in sorted({str(c["error"]) for c in r.callers if c.get("error")}):
            print(f"   a first caller's error: {error[:300]}", flush=True)
    out = Report("overload", quick=args.quick)
    calls = f"{args.calls} calls, --max-cpu {args.max_cpu:g}, a crowd of {args.crowd} arriving"
    n = sum(len(c.get("heard_stop_ms", [])) for c in guarded.callers)
    for round_, tag, who in ((guarded, "guarded", "with --max-cpu"), (unguarded, "unguarded", "without it")):
        out.add(f"overload.{tag}.bargein_heard_p95",
                f"barge-in as the admitted callers heard it, p95, while a crowd arrives at a saturated worker {who} "
                f"({calls}); floor: the same calls alone", round_.heard_stop_p95(), floor=alone.heard_stop_p95(),
                unit="ms", n=n, area="overload")
        out.add(f"overload.{tag}.reply_p95",
                f"end of the admitted callers' question to the reply's first sound, p95, while a crowd arrives {who} "
                f"({calls}); floor: the same calls alone", round_.reply_p95(), floor=alone.reply_p95(), unit="ms",
                n=sum(len(c.get("reply_after_ms", [])) for c in round_.callers), area="overload")
        out.add(f"overload.{tag}.underruns_per_call_minute",
                f"the admitted calls' playout underruns per call minute while a crowd arrives {who}; floor: alone",
                round_.underruns_per_minute(), floor=alone.underruns_per_minute(), unit="count",
                n=len(round_.callers), area="overload", compare="ratio")
    out.add("overload.crowd_refused", f"of a crowd of {args.crowd} arriving at a worker whose machine is past "
            f"--max-cpu {args.max_cpu:g}: refused (503 overloaded); floor: refused without the limit",
            guarded.refused(), floor=unguarded.refused(), unit="calls", n=len(guarded.crowd), area="overload")
    out.write()


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        log_dir = Path(tmp)
        speech = str(log_dir / "speech.npz")
        write_speech(speech)
        ports = [free_port() for _ in range(4)]
        guarded = start_worker("guarded", ports[0], ports[1], args, args.max_cpu, log_dir)
        unguarded = start_worker("unguarded", ports[2], ports[3], args, 0.0, log_dir)
        try:
            for worker, metrics_port in ((guarded, ports[1]), (unguarded, ports[3])):
                wait_for_metrics(worker, metrics_port, 180)
            rounds = {}
            for name, port, crowd in (("alone", ports[0], False), ("crowd", ports[0], True),
                                      ("crowd, unguarded", ports[2], True)):
                await calm(ports[1], args.max_cpu)
                print(f"-- {name}", flush=True)
                rounds[name] = await run_round(name, f"http://127.0.0.1:{port}", args, speech, crowd)
            report(rounds, args)
        finally:
            guarded.stop()
            unguarded.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", default="reference", help="the workers' model")
    parser.add_argument("--calls", type=int, default=3, help="callers up before the crowd comes")
    parser.add_argument("--crowd", type=int, default=6, help="callers who arrive meanwhile")
    parser.add_argument("--arrival-s", type=float, default=2.0, help="seconds between the crowd's callers")
    parser.add_argument("--max-cpu", type=float, default=0.8, help="the guarded worker's limit")
    parser.add_argument("--seconds", type=float, default=45.0, help="each round's length")
    parser.add_argument("--quick", action="store_true", help="2 calls, a crowd of 3, 25 s rounds")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.crowd, args.seconds = 2, 3, 25.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
