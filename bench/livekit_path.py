"""The LiveKit path's CPU per call at 4, 8 and 16 simultaneous calls, against a bare aiortc echo peer.

a. The livekit FFI fan-outs alone, the SDK's way against ours, alternating, same run: N calls'
   audio in and out of one process (``bench.livekit_ffi``), and N rooms in one process whose
   agents speak all the time (``bench.livekit_rooms``: room subscriptions as shipped vs routed).
b. Whole calls: three processes besides the callers, the loopback LiveKit server, the LiveKit
   worker (``bench.livekit_worker``, scripted plugin) and the transport floor
   (``bench.echo_peer``); rounds alternate between the worker and the floor at each N (and a
   ``--control`` checkout's worker, for an A/B), and the LiveKit barge-in floor, a bare
   ``livekit.rtc`` agent (``bench.livekit_echo_agent``) through the same server, whose
   caller-heard barge-in is printed beside the worker's with the difference. The server's own CPU is reported beside the
   worker's but left out of it. Figures come from the worker's ``/metrics`` and the callers'
   JSON lines (see ``bench.call_rounds``). The issue's marks: per call at 16 within 1.1x of
   per call at 4, and <= 2 % of a core per call.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_path [--quick] [--sessions 4,8,16] [--window 8] [--profile] [--control ../main]
"""

from __future__ import annotations

import sys

from bench import livekit_ffi, livekit_rooms
from bench.call_rounds import main, parse_args

if __name__ == "__main__":
    args = parse_args(__doc__.splitlines()[0], extra=[("--ffi-seconds", {"type": float, "default": None,
                      "help": "part a's window per round (5; quick: 3; 0 skips part a)"})])
    seconds = args.ffi_seconds if args.ffi_seconds is not None else (3.0 if args.quick else 5.0)
    if seconds:
        print("a. the livekit FFI audio fan-out alone (N calls, a thread and loop each, in this process)", flush=True)
        livekit_ffi.report(livekit_ffi.run(args.session_counts, seconds), args.session_counts)
        print("   the room-event fan-out alone (N rooms whose agents speak all the time, a thread and loop each)",
              flush=True)
        livekit_rooms.run_and_report(args.session_counts, seconds)
    print("b. whole calls through the loopback LiveKit server", flush=True)
    sys.exit(main(("livekit", "livekit-echo", "echo"), "the LiveKit path's CPU per call", args=args))
