"""What one end-of-turn inference costs: its wait and its CPU, on one thread against the library's default.

livekit-local-inference reads ``EOT_PARALLELISM`` once, when the model loads, so each mode runs
in a process of its own: ``none`` (one thread, what the worker sets unless told otherwise) and
``full`` (the library's default: helper threads started for each inference). Each process
loads the model and times inferences on 1.2 s of synthetic speech; CPU is the whole process's
(``time.process_time``), so the helper threads count. The modes alternate, in the same run.

Run: python -m bench.end_of_turn_cost [--inferences 40] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("none", "full")


def measure(inferences: int) -> dict[str, float]:
    """In this process: per inference, the wall time (median) and the process's CPU (mean)."""
    from devtools.speech import speak
    from duplex_agent.agent.models.end_of_turn import EndOfTurnModel

    model = EndOfTurnModel.shared()
    audio = speak("Could you tell me where the station is?", 16000)
    model.probability(audio)  # warm
    walls = []
    cpu = time.process_time()
    for _ in range(inferences):
        started = time.perf_counter()
        model.probability(audio)
        walls.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu
    return {"wall_ms": 1000 * statistics.median(walls), "cpu_ms": 1000 * cpu / inferences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inferences", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3, help="processes per mode, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.inferences)))
        return
    print(f"== one end-of-turn inference, per mode ({os.cpu_count()} cores, {args.inferences} inferences "
          f"x {args.runs} processes each) ==", flush=True)
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.runs):
        for mode in MODES:
            env = {**os.environ, "EOT_PARALLELISM": mode, "HF_HUB_OFFLINE": "1"}
            out = subprocess.run([sys.executable, "-m", "bench.end_of_turn_cost", "--child",
                                  "--inferences", str(args.inferences)], env=env, capture_output=True, text=True,
                                 check=True)
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for mode in MODES:
        wall = statistics.median(r["wall_ms"] for r in results[mode])
        cpu = statistics.median(r["cpu_ms"] for r in results[mode])
        print(f"  EOT_PARALLELISM={mode:4}: wait {wall:5.1f} ms, CPU {cpu:5.1f} ms per inference "
              f"(median of {args.runs} processes)")
    ratio = (statistics.median(r["cpu_ms"] for r in results["none"])
             / statistics.median(r["cpu_ms"] for r in results["full"]))
    print(f"  one thread's CPU over the default's: {ratio:.2f}x")


if __name__ == "__main__":
    main()
