"""The LiveKit worker as ``duplex-agent start`` runs it, plus ``/metrics`` for the benchmarks.

``bench.livekit_path`` reads the worker's figures (barge-in latency, underruns,
open sessions) from ``/metrics`` rather than from its log. Settings come from the
environment (DUPLEX_*, LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET), as for
the worker itself.

Run: python -m bench.livekit_worker --metrics-port 8091
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from duplex_agent.agent.app.bootstrap import start_backend
from duplex_agent.agent.app.livekit_worker import LiveCalls, build_agent_server
from duplex_agent.agent.app.server import build_app, start_http
from duplex_agent.agent.app.settings import Settings


async def serve(settings: Settings, metrics_port: int) -> None:
    backend = await start_backend(settings)
    server = build_agent_server(settings, backend, LiveCalls(), dev=False)
    http = await start_http(build_app(backend, settings, with_webrtc=False), "127.0.0.1", metrics_port)
    print(f"bench livekit worker: /metrics on http://127.0.0.1:{metrics_port}", flush=True)
    try:
        await server.run()
    finally:
        await http.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings, args.metrics_port))


if __name__ == "__main__":
    main()
