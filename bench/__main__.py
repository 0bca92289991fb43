"""`make bench`: every benchmark, one after another, each in its own process (~10 min on 2 cores)."""

import subprocess
import sys

BENCHMARKS = (
    ("bench.runtime_overhead", []),
    ("bench.turn_latency", ["20"]),
    ("bench.caller_turn_latency", []),
    ("bench.vad_pass", []),
    ("bench.direct_path", []),
    ("bench.livekit_path", []),
    ("bench.remote_hop", ["100"]),
    ("bench.wire_encoding", []),
    ("bench.access_overhead", []),
)


def main() -> int:
    failed = []
    for module, args in BENCHMARKS:
        print(f"\n######## python -m {module} {' '.join(args)}".rstrip(), flush=True)
        if subprocess.run([sys.executable, "-m", module, *args]).returncode != 0:
            failed.append(module)
    if failed:
        print(f"\nbenchmarks that did not finish: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
