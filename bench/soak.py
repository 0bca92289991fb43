"""An hour of calls: does anything grow, is any call lost, do the late calls fare as the early ones?

Direct WebRTC, LiveKit and LiveKit Agents callers (``bench.soak_rig``) take turns on ``--concurrent``
lines; each line starts a new call as soon as its last one ends (``bench.soak_calls``), so that many
calls are live at once for the whole run. Each call is a real caller process: it asks a question,
hears ~300 ms of the reply, talks over it with its next question, and so on (``bench.livekit_callers``);
every reply of the direct and LiveKit workers makes a tool call that the worker runs at the edge.
Calls last 1-3 minutes in an hour's run, shorter in a shorter one (never under 20 s).

Every ``--sample-s`` the workers are sampled (``bench.soak_probe``): memory, descriptors, threads,
asyncio tasks and livekit FFI handles, from their /metrics (the Agents app, which has none, from
outside). The summary prints, beside the goals:
- growth after warm-up, per 100 finished calls (goal: under 1 MB of memory, nothing else grows);
- calls dropped and questions unanswered (goal: none);
- p95 turn and barge-in latency as the callers heard them, the first third of the calls after
  warm-up against the last third (goal: late within 10 % of early).

The default of 4 calls at once is what this 2-core machine holds with cores to spare for the
callers themselves (8 at once is for a machine with more cores: ``--concurrent 8``). Figures
go to bench/results/soak.json; the run never passes or fails on them.

Run: python -m bench.soak [--minutes 60] [--concurrent 4] [--kinds direct,livekit,agents] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.call_rig import children_take_sigint, write_speech
from bench.report import Report
from bench.soak_calls import CallResult, Schedule, run_lines
from bench.soak_probe import Sample, from_metrics, from_process_tree
from bench.soak_report import summarize
from bench.soak_rig import KINDS, SoakRig, Worker

#: Calls last 1-3 minutes in an hour's run; a shorter run scales them down, to this floor (a LiveKit
#: caller takes a few seconds to join and be heard on a loaded machine).
HOUR_CALL_S = (60.0, 180.0)
SHORTEST_CALL_S = (20.0, 40.0)


def call_lengths(minutes: float) -> tuple[float, float]:
    scale = min(1.0, minutes / 60.0)
    return (max(SHORTEST_CALL_S[0], HOUR_CALL_S[0] * scale), max(SHORTEST_CALL_S[1], HOUR_CALL_S[1] * scale))


def sample(worker: Worker, t_s: float, calls_done: int, calls_live: int) -> Sample:
    out = Sample(t_s, calls_done, calls_live)
    if worker.metrics_port is not None:
        read = from_metrics(worker.metrics_port)
        if read is not None:
            out.values, out.sessions = read
    else:
        out.values = from_process_tree(worker.service.pid)
    return out


async def soak(args: argparse.Namespace, rig: SoakRig, speech: str) -> tuple[list[CallResult], dict[str, list[Sample]]]:
    schedule = Schedule(args.minutes * 60.0, args.concurrent, call_lengths(args.minutes))
    samples: dict[str, list[Sample]] = {w.name: [] for w in rig.workers}
    done: dict[str, int] = dict.fromkeys(KINDS, 0)
    live: dict[str, int] = dict.fromkeys(KINDS, 0)
    t0 = time.monotonic()

    def started(kind: str) -> None:
        live[kind] += 1

    def ended(call: CallResult) -> None:
        done[call.kind] += 1
        live[call.kind] -= 1
        status = f"DROPPED ({call.dropped})" if call.dropped else \
            f"{call.questions - call.unanswered}/{call.questions} answered, {call.interruptions} barge-ins" \
            + (f", {call.resumes} resume" if call.resumes else "")
        print(f"  {call.ended_s:6.0f} s  call {call.index:3d} {call.kind:7} {call.ended_s - call.started_s:4.0f} s: "
              f"{status}", flush=True)

    def take() -> None:
        now = time.monotonic() - t0
        for worker in rig.workers:
            samples[worker.name].append(sample(worker, now, done[worker.serves], live[worker.serves]))

    async def sampler() -> None:
        while True:
            await asyncio.to_thread(take)
            await asyncio.sleep(args.sample_s)

    sampling = asyncio.create_task(sampler())
    try:
        calls = await run_lines(schedule, rig.targets, speech, t0, started, ended)
        # The calls are over: give the workers time to close them, then the last sample shows
        # whether anything stayed behind once nothing is live.
        await asyncio.sleep(args.settle_s)
        await asyncio.to_thread(take)
    finally:
        sampling.cancel()
    return calls, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long calls are placed")
    parser.add_argument("--concurrent", type=int, default=4, help="calls live at once")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the kinds of call, taking turns")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples of the workers")
    parser.add_argument("--settle-s", type=float, default=15.0, help="after the last call, before the last sample")
    parser.add_argument("--quick", action="store_true", help="3 minutes, samples every 5 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.sample_s = 3.0, 5.0
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    children_take_sigint()
    report = Report("soak", quick=args.quick)
    lengths = call_lengths(args.minutes)
    print(f"soak: {args.minutes:g} min of {', '.join(kinds)} calls, {args.concurrent} at once, each "
          f"{lengths[0]:.0f}-{lengths[1]:.0f} s", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    speech = str(log_dir / "speech.npz")
    write_speech(speech)
    rig = SoakRig(log_dir, kinds, capacity=args.concurrent + 4)
    try:
        rig.start()
        calls, samples = asyncio.run(soak(args, rig, speech))
    finally:
        rig.stop()
    if any(c.dropped or c.unanswered for c in calls):
        print(f"the workers' logs are kept in {log_dir}", flush=True)  # what a lost call left behind
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    summarize(report, calls, samples, rig.workers, warmup_s=max(lengths[0] + lengths[1], args.minutes * 6.0))
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
