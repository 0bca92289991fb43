"""``make test``'s whole suite as two pytest processes side by side.

One half holds the folders whose tests wait on real time against real peers (callers that speak
in real time through the loopback LiveKit server, the namespaced network, the vLLM-Omni peer),
the other everything else. Most of either half's time is audio played at its own pace, not
CPU, so on 2 cores the whole suite takes about as long as the longer half.
The suite's tests pass on a busy machine, and each half is a plain pytest run: no test is
shared, skipped or retried; each ends with its slowest tests.

Each half's output goes to a log under ``artifacts/test-logs/``, printed whole when that half
ends, beside its JUnit XML report; a failed test's ``tmp_path`` (its worker and app logs, its records) stays under
``artifacts/test-tmp/<half>/``. The exit status is 0 only when both halves pass.

Run: python -m devtools.split_suite [pytest options for both halves]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Folders of real-time calls against real peers: one half, run in this order.
REAL_TIME = ("tests/omni_peer", "tests/livekit_agents", "tests/network", "tests/livekit")
LOGS = REPO / "artifacts" / "test-logs"
TMP = REPO / "artifacts" / "test-tmp"
#: Each half ends with its slowest tests and their times: where the suite's time goes.
SLOWEST_SHOWN = 15


def halves(options: list[str]) -> dict[str, list[str]]:
    """Each half's name and pytest command line."""
    def pytest(name: str) -> list[str]:
        return [sys.executable, "-m", "pytest", f"--basetemp={TMP / _slug(name)}",
                f"--junitxml={LOGS / _slug(name)}.xml",
                "-o", "tmp_path_retention_policy=failed", f"--durations={SLOWEST_SHOWN}", *options]

    return {
        "real-time peers": [*pytest("real-time peers"), *REAL_TIME],
        "the rest": [*pytest("the rest"), "tests", *(f"--ignore={folder}" for folder in REAL_TIME)],
    }


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def main(options: list[str]) -> int:
    LOGS.mkdir(parents=True, exist_ok=True)
    TMP.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, Path]] = {}
    for name, command in halves(options).items():
        log = LOGS / f"{_slug(name)}.log"
        with log.open("w") as out:
            running[name] = (subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT), log)
        print(f"started {name}: {' '.join(command[2:])} (log: {log.relative_to(REPO)})", flush=True)
    started, failed = time.monotonic(), []
    while running:
        for name, (process, log) in list(running.items()):
            if process.poll() is None:
                continue
            del running[name]
            print(f"\n===== {name}: exit {process.returncode} after {time.monotonic() - started:.0f} s =====")
            print(log.read_text(errors="replace"), flush=True)
            if process.returncode != 0:
                failed.append(name)
        time.sleep(1.0)
    print(f"\n===== both halves done in {time.monotonic() - started:.0f} s: "
          f"{'failed: ' + ', '.join(failed) if failed else 'passed'} =====")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
