"""The LiveKit path's CPU per call at 4, 8 and 16 simultaneous calls, against a bare aiortc echo peer.

Three processes besides the callers: the loopback LiveKit server, the LiveKit worker
(``bench.livekit_worker``, scripted plugin) and the transport floor (``bench.echo_peer``).
Rounds alternate between the worker and the floor at each N, in the same run; the
server's own CPU is reported beside the worker's but left out of it. Figures come
from the worker's ``/metrics`` and the callers' JSON lines (see ``bench.call_rounds``).
The issue's marks: per call at 16 within 1.1x of per call at 4, and <= 2 % of a core per call.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_path [--quick] [--sessions 4,8,16] [--window 8] [--profile]
"""

from __future__ import annotations

import sys

from bench.call_rounds import main

if __name__ == "__main__":
    sys.exit(main(("livekit", "echo"), "the LiveKit path's CPU per call", __doc__.splitlines()[0]))
