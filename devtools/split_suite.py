"""``make test``'s whole suite as pytest processes side by side, one per lane.

One lane holds the folders whose tests wait on real time against LiveKit and vLLM-Omni peers
(callers that speak in real time through the loopback LiveKit server, the vLLM-Omni peer,
livekit-agents' AgentSession), the other everything else: the fast tier and the other real-peer
tests, the namespaced network's among them, which even the two lanes' lengths. Most of a
real-time lane's time is audio played at its own pace, not CPU, so on 2 cores the whole suite
takes about as long as the longest lane. The suite's tests are meant to pass on a busy machine,
and each lane is a plain pytest run: no test is shared, skipped or
retried; each ends with its slowest tests.

Each lane's output goes to a log under ``artifacts/test-logs/``, printed whole when that lane
ends, beside its JUnit XML report; a failed test's ``tmp_path`` (its worker and app logs, its
records) stays under ``artifacts/test-tmp/<lane>/``. The exit status is 0 only when every lane passes.

Run: python -m devtools.split_suite [pytest options for every lane]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Folders of real-time calls against real peers: one lane, beside the rest. (Two real-time lanes
#: beside the rest took no less wall time in a fresh clone and failed more real-time tests.)
REAL_TIME_LANES = {
    "real-time peers": ("tests/omni_peer", "tests/livekit_agents", "tests/livekit"),
}
LOGS = REPO / "artifacts" / "test-logs"
TMP = REPO / "artifacts" / "test-tmp"
#: Each half ends with its slowest tests and their times: where the suite's time goes.
SLOWEST_SHOWN = 15


def lanes(options: list[str]) -> dict[str, list[str]]:
    """Each lane's name and pytest command line."""
    def pytest(name: str) -> list[str]:
        return [sys.executable, "-m", "pytest", f"--basetemp={TMP / _slug(name)}",
                f"--junitxml={LOGS / _slug(name)}.xml",
                "-o", "tmp_path_retention_policy=failed", f"--durations={SLOWEST_SHOWN}", *options]

    real_time = [folder for folders in REAL_TIME_LANES.values() for folder in folders]
    return {
        **{name: [*pytest(name), *folders] for name, folders in REAL_TIME_LANES.items()},
        "the rest": [*pytest("the rest"), "tests", *(f"--ignore={folder}" for folder in real_time)],
    }


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def main(options: list[str]) -> int:
    LOGS.mkdir(parents=True, exist_ok=True)
    TMP.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, Path]] = {}
    for name, command in lanes(options).items():
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
    print(f"\n===== every lane done in {time.monotonic() - started:.0f} s: "
          f"{'failed: ' + ', '.join(failed) if failed else 'passed'} =====")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
