"""A process that used livekit exits cleanly even when it leaves in the middle of a call.

livekit's threads call into Python for every event; one caught in a callback once the
interpreter has begun to finalize aborts the process (exit 134) after all its work is done.
ffi_router.dispose_ffi (registered at exit) disposes the FFI and waits those callbacks out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNS = 3


def test_leaving_mid_call_disposes_the_ffi_with_no_callback_in_flight_and_exits_0() -> None:
    env = {**os.environ, "RUST_BACKTRACE": "1"}
    for run in range(RUNS):
        done = subprocess.run([sys.executable, "-m", "tests.livekit_server_tests.ffi_exit_entry"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=180)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"run {run}: exit {done.returncode}\n{out[-4000:]}"
        assert "disposed=True frames=50 in_callback=0" in done.stdout, out[-4000:]
        assert "panic" not in out.lower(), out[-4000:]
