"""Run the loopback server as a process: python -m devtools.livekit_server --port 0 --print-url"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from .server import ServerCore


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m devtools.livekit_server")
    ap.add_argument("--host", default="127.0.0.1",
                    help="the address the signal server listens on (0.0.0.0: every interface); media "
                         "goes over the machine's interface either way, as aiortc's ICE skips loopback")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key", default=os.environ.get("LIVEKIT_API_KEY", "devkey"))
    ap.add_argument("--api-secret", default=os.environ.get("LIVEKIT_API_SECRET", "secret"))
    ap.add_argument("--advertise-ip", default=None)
    ap.add_argument("--no-v1", action="store_true",
                    help="serve only the v0 signal path (/rtc, two peer connections), as a LiveKit server older than v1")
    ap.add_argument("--print-url", action="store_true", help="print the ws:// url on stdout")
    ap.add_argument("--log-level", default="WARNING")
    return ap.parse_args(argv)


async def _main(ns: argparse.Namespace) -> None:
    server = ServerCore(
        ns.api_key, ns.api_secret, host=ns.host, port=ns.port, advertise_ip=ns.advertise_ip,
        single_pc=not ns.no_v1,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # kill -USR1: the forwarding record's summary on stderr, for a live call that went quiet
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(
        "\n".join(["forwarding:", *server.forwarding.summary(time.perf_counter_ns())]), file=sys.stderr, flush=True))
    await server.start()
    if ns.print_url:
        # Callers read the URL as "ready": the signal handlers are in place before it.
        print(server.url, flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    ns = _args(argv)
    logging.basicConfig(level=ns.log_level.upper(), stream=sys.stderr)
    asyncio.run(_main(ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
