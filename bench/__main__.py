"""`make bench`: every benchmark, one after another, each in its own process.

``python -m bench --quick`` passes --quick to the call-path benchmarks (4 and 16 calls, short windows).
"""

import subprocess
import sys

BENCHMARKS = (
    ("bench.runtime_overhead", []),
    ("bench.turn_latency", ["20"]),
    ("bench.caller_turn_latency", []),
    ("bench.vad_pass", []),
    ("bench.end_of_turn_cost", []),
    ("bench.direct_path", []),
    ("bench.receive_buffer", []),
    ("bench.livekit_path", []),
    ("bench.remote_hop", ["100"]),
    ("bench.wire_encoding", []),
    ("bench.access_overhead", []),
)
TAKES_QUICK = {"bench.direct_path", "bench.livekit_path"}


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for module, args in BENCHMARKS:
        args = [*args, "--quick"] if quick and module in TAKES_QUICK else args
        print(f"\n######## python -m {module} {' '.join(args)}".rstrip(), flush=True)
        if subprocess.run([sys.executable, "-m", module, *args]).returncode != 0:
            failed.append(module)
    if failed:
        print(f"\nbenchmarks that did not finish: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
