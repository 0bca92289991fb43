"""Rounds of N simultaneous calls against workers in processes of their own: CPU per call, from /metrics.

Shared by ``bench.livekit_path`` and ``bench.livekit_vs_direct``: their options, and the run. Every party
is its own process, so each one's CPU is its own (psutil cpu_times deltas over a steady window):

- ``direct``: the worker, ``duplex-agent serve --plugin scripted`` (aiortc peers, ``POST /api/offer``);
- ``livekit``: the loopback LiveKit server (``devtools.livekit_server``) and the LiveKit worker
  (``duplex-agent start --metrics-port``: the worker as users run it, with ``/metrics``);
- ``echo``: the transport floor, bare aiortc peers echoing each caller (``bench.echo_peer``);
- per round, N callers in one process (``bench.livekit_callers``), each looping: say a question,
  hear ~300 ms of the reply, say an interruption that runs on into the next question.

The workers' figures (open sessions, playout underruns, the barge-in latency histogram) come from
their ``/metrics``; the callers' figures from the JSON lines they print. Rounds of the paths
alternate at each N, so every path is measured in the same run under the same load.

The rig (``bench.call_rig``) starts the processes and drives and samples each round; what a round
measured is a ``bench.call_figures.Round``; the report (``bench.call_report``) works out the verdicts
as data and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.call_figures import CONTROL, FLOORS, Run, kind, per_call
from bench.call_report import add_figures, describe, judge, print_report
from bench.call_rig import Rig, children_take_sigint, write_speech
from bench.report import Report


async def run(rig: Rig) -> Run:
    """Every round, the paths alternating at each N, until the call counts or the time budget run out."""
    args = rig.args
    started = time.perf_counter()
    figures = Run(rig.paths, args.window, os.cpu_count() or 1, idle=rig.idle)
    rounds, skipped = figures.rounds, figures.skipped
    for sessions in args.session_counts:
        elapsed = time.perf_counter() - started
        # The next N takes at least as long as the last one did, every path together.
        if rounds and elapsed + sum(r.took_s for r in rounds[-len(rig.paths):]) > args.budget:
            skipped.append(f"{sessions} calls: the run's time budget of {args.budget:.0f} s was spent")
            continue
        for path in rig.paths:
            want = 0 if path == "echo" else args.round_trials[sessions]  # the CPU floor takes no barge-in trials
            result = await rig.round(path, sessions, want, profile=args.profile and sessions == args.profile_at)
            rounds.append(result)
            print(f"   ... {path:16} {sessions:2d} calls: worker {result.worker_cores:.3f} cores "
                  f"({per_call(result, rig.idle):.2f}% per call), {result.barge_ins} barge-ins, "
                  f"{result.took_s:.0f} s" + (f" [{result.note}]" if result.note else ""), flush=True)
    return figures


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def parse_args(description: str, extra: list[tuple[str, dict[str, Any]]] = ()) -> argparse.Namespace:
    """The rounds' options (and a bench's own ``extra`` ones)."""
    parser = argparse.ArgumentParser(description=description)
    for flag, options in extra:
        parser.add_argument(flag, **options)
    # Left unset, these take the full run's values, or --quick's.
    parser.add_argument("--sessions", help="simultaneous calls per round, per path (4,8,16; quick: 4)")
    parser.add_argument("--window", type=float, help="steady CPU window per round, seconds (8; quick: 5)")
    parser.add_argument("--warmup", type=float, help="seconds after every caller hears the agent (2; quick: 1.5)")
    parser.add_argument("--trials", help="interruptions each round waits for, by --sessions entry (8,4,2; quick: 6)")
    parser.add_argument("--round-limit", type=float, default=90.0, help="most seconds of one round")
    parser.add_argument("--trial-wait", type=float,
                        help="most seconds a round waits for its interruptions after the CPU window (20; quick: 10)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="skip the larger call counts when the rounds would run past this many seconds")
    parser.add_argument("--profile", action="store_true", help="sample the worker with py-spy in one round per path")
    parser.add_argument("--profile-at", type=int, default=8, help="the call count whose rounds --profile samples")
    parser.add_argument("--quick", action="store_true",
                        help="4 calls, 5 s windows, few interruptions: a few minutes on a quiet machine")
    parser.add_argument("--control", default="", metavar="CHECKOUT",
                        help="also run each worker from this checkout (its .venv), round for round: an A/B in one run")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their folder is printed)")
    args = parser.parse_args()
    full = {"sessions": "4,8,16", "window": 8.0, "warmup": 2.0, "trials": "8,4,2", "trial_wait": 20.0}
    quick = {"sessions": "4", "window": 5.0, "warmup": 1.5, "trials": "6", "trial_wait": 10.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.session_counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    trials = [int(n) for n in args.trials.split(",") if n.strip()]
    args.round_trials = {n: trials[i] if i < len(trials) else (trials[-1] if trials else 0)
                         for i, n in enumerate(args.session_counts)}
    if args.profile and args.profile_at not in args.session_counts:
        args.profile_at = args.session_counts[len(args.session_counts) // 2]
    return args


def main(paths: tuple[str, ...], title: str, description: str = "", *, args: argparse.Namespace | None = None,
         bench: str = "") -> int:
    """Run the rounds; with ``bench``, write its figures to bench/results/<bench>.json."""
    args = args or parse_args(description)
    report = Report(bench, quick=args.quick) if bench else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"== duplex-agent: {title} (python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start) ==", flush=True)
    started = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-calls-"))
    if args.control:
        paths = tuple(p for path in paths for p in ((path, path + CONTROL) if kind(path) not in FLOORS else (path,)))
    rig = Rig(args, paths, log_dir)
    children_take_sigint()
    signal.signal(signal.SIGTERM, _interrupt)  # unwind through the finally below: every process stops
    status = 0
    try:
        write_speech(rig.speech_file)
        rig.start()
        print("   " + ", ".join(f"{describe(p)}: pid {rig.workers[p].pid}" for p in rig.paths)
              + f"; scripted plugin; set-up {time.perf_counter() - started:.0f} s", flush=True)
        rig.measure_idle()
        print("   idle before any call, cores per window (the least counts): "
              + "; ".join(f"{p} " + " ".join(f"{c:.3f}" for c in w) for p, w in rig.idle_windows.items()), flush=True)
        figures = asyncio.run(run(rig))
        verdicts = judge(figures)
        print_report(figures, verdicts)
        if report is not None:
            add_figures(report, figures, verdicts)
            report.write()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception as exc:
        print(f"the rounds failed: {exc!r}", file=sys.stderr)
        status = 1
    finally:
        rig.stop()
        if args.keep_logs or status:
            print(f"logs: {log_dir}")
        else:
            for path in log_dir.iterdir():
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                log_dir.rmdir()
    print(f"total {time.perf_counter() - started:.0f} s")
    return status

