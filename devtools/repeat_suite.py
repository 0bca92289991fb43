"""Runs the suite (or the tests named) N times and reports every failure by test name: the
flake hunt's tool. A test that fails once has a cause; this finds which ones fail, how
often, and keeps each failing run's log to read it.

Each run is ``make test``'s own command (``devtools.split_suite``), or one pytest run of the
pytest arguments given after ``--``. ``--busy-loops K`` keeps K processes spinning on the CPU
meanwhile (``yes > /dev/null``), the loaded machine the suite must pass on.

Each run writes JUnit XML under ``artifacts/repeat/run-<i>/``; the failing runs' logs stay there.

Run: python -m devtools.repeat_suite --runs 5 --busy-loops 2
     python -m devtools.repeat_suite --runs 10 -- tests/livekit_agents -k barge_in
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "artifacts" / "repeat"
SPLIT_REPORTS = REPO / "artifacts" / "test-logs"


def failed_tests(junit_files: list[Path]) -> list[str]:
    """The node ids of the tests that failed or errored in these JUnit XML reports."""
    failed = []
    for path in junit_files:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            failed.append(f"{path.name}: no report (the run died)")
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                module = case.get("classname", "").replace(".", "/")
                failed.append(f"{module}.py::{case.get('name')}")
    return failed


def one_run(index: int, pytest_args: list[str]) -> tuple[int, list[str], float]:
    """Runs the suite once; its exit status, failed tests and wall time."""
    run_dir = OUT / f"run-{index}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in [*run_dir.glob("*.xml"), *SPLIT_REPORTS.glob("*.xml")]:
        old.unlink()
    if pytest_args:
        command = [sys.executable, "-m", "pytest", "-q", f"--junitxml={run_dir / 'pytest.xml'}", *pytest_args]
    else:
        command = [sys.executable, "-m", "devtools.split_suite", "-q"]
    started = time.monotonic()
    with (run_dir / "output.log").open("w") as log:
        status = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if not pytest_args:  # each half of the split suite wrote its own report
        for report in SPLIT_REPORTS.glob("*.xml"):
            shutil.copy(report, run_dir / report.name)
    reports = sorted(run_dir.glob("*.xml"))
    failed = failed_tests(reports) if reports else ["no report at all (see output.log)"]
    if status != 0 and not failed:
        failed = [f"exit {status} with no failed test (see output.log)"]
    return status, failed, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy-loops", type=int, default=0, help="CPU hogs beside the suite")
    parser.add_argument("pytest_args", nargs="*", help="after --: one pytest run of these instead of the suite")
    args = parser.parse_args()
    # `yes` itself, not a shell running it: killing a shell leaves its `yes` spinning after the runs.
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy_loops)]
    counts: Counter[str] = Counter()
    try:
        for i in range(1, args.runs + 1):
            status, failed, wall = one_run(i, args.pytest_args)
            counts.update(failed)
            verdict = "green" if status == 0 else f"RED ({len(failed)} failed)"
            print(f"run {i}/{args.runs}: {verdict} in {wall:.0f} s", flush=True)
            for name in failed:
                print(f"    {name}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"\n{args.runs} runs, {args.busy_loops} busy loops: "
          + (f"{sum(counts.values())} failures" if counts else "no failure"))
    for name, n in counts.most_common():
        print(f"  {n}x {name}")
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
