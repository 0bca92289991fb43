"""The LiveKit worker's CPU per call beside the direct worker's, round for round in one run.

Both workers serve the same scripted calls from the same callers (``bench.call_rounds``); rounds
alternate between them at each N, so a noisy machine weighs on both alike. The figure to read is
LiveKit's per call over direct's in the same round. ``--control`` adds a second checkout's
workers, for an A/B of a change.

Prints figures and writes bench/results/livekit_vs_direct.json; never passes or fails on time.

Run: python -m bench.livekit_vs_direct [--quick] [--sessions 4,8,16] [--window 8] [--trials 0] [--control ../main]
"""

from __future__ import annotations

import sys

from bench.call_rounds import main

if __name__ == "__main__":
    sys.exit(main(("livekit", "direct"), "LiveKit against direct, CPU per call", __doc__.splitlines()[0],
                  bench="livekit_vs_direct"))
