"""Barge-in as a LiveKit caller hears it, beside a bare livekit.rtc agent, and the LiveKit path's CPU per call.

Whole calls: the loopback LiveKit server, the LiveKit worker (``duplex-agent start``, scripted
plugin), the LiveKit barge-in floor, a bare ``livekit.rtc`` agent (``bench.livekit_echo_agent``)
through the same server, and the transport floor (``bench.echo_peer``), each its own process; rounds
alternate between them at each N (and a ``--control`` checkout's worker, for an A/B). The callers'
heard barge-in on the worker is printed beside the bare agent's, with the difference. The server's own
CPU is reported beside the worker's but left out of it. Figures come from the worker's ``/metrics`` and
the callers' JSON lines (see ``bench.call_rounds``).

Prints figures and writes bench/results/livekit_path.json; never passes or fails on time.

Run: python -m bench.livekit_path [--quick] [--sessions 4,8,16] [--window 8] [--profile] [--control ../main]
"""

from __future__ import annotations

import sys

from bench.call_rounds import main, parse_args

if __name__ == "__main__":
    args = parse_args(__doc__.splitlines()[0])
    sys.exit(main(("livekit", "livekit-echo", "echo"), "LiveKit barge-in and CPU per call", args=args,
                  bench="livekit_path"))
