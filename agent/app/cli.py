"""``duplex-agent``: serve the embedded worker, or run as a LiveKit worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from duplex_agent.agent.app.bootstrap import start_backend
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.app.shutdown import ShutdownSignals, drain
from duplex_agent.agent.models.model_errors import MissingModelError, ModelStartError

log = logging.getLogger("duplex_agent")


async def serve(settings: Settings) -> None:
    from duplex_agent.agent.app.server import build_app, start_http

    signals = ShutdownSignals()
    signals.install()
    backend = await start_backend(settings)
    runner = await start_http(build_app(backend, settings), settings.host, settings.port)
    print(f"duplex-agent is serving on http://{settings.host}:{settings.port}/  (Ctrl-C to stop)", flush=True)
    try:
        await signals.requested.wait()
        left = await drain(backend, settings.drain_timeout)
        if left:
            log.warning("drain timeout: closing %d live session(s)", left)
    finally:
        await backend.close()  # live sessions end with session.closed (shutdown)
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_env()
    parser = argparse.ArgumentParser(prog="duplex-agent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "serve the page, WebRTC and the realtime websocket on one port"),
                       ("start", "run as a LiveKit worker (production)"),
                       ("dev", "run as a LiveKit worker (development: verbose, mints tokens for the page)")):
        settings.add_arguments(commands.add_parser(name, help=text))
    args = parser.parse_args(argv)
    settings.apply(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            asyncio.run(serve(settings))
        else:
            from duplex_agent.agent.app.livekit_worker import run_worker

            return run_worker(settings, dev=args.command == "dev")
    except (MissingModelError, ModelStartError) as exc:
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
