"""``duplex-agent``: serve the embedded worker, or run as a LiveKit worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from agent.audio import encode_wire_audio
from agent.backend import DuplexBackend
from agent.model_errors import MissingModelError
from agent.settings import Settings

log = logging.getLogger("duplex_agent")


def build_backend(settings: Settings) -> DuplexBackend:
    """The backend the settings ask for; loads models (once) with progress on the log."""
    if settings.backend:
        import json
        from pathlib import Path

        from agent.remote_backend import RemoteBackend

        session = json.loads(Path(settings.backend_session).read_text()) if settings.backend_session else None
        return RemoteBackend(settings.backend, model=settings.backend_model, api_key=settings.backend_api_key,
                             max_sessions=settings.max_sessions, session=session)
    from agent.local_backend import LocalBackend
    from agent.vad import SileroVadModel
    from plugins.contract import load_duplex_plugin, validate_duplex_plugin_sampling

    log.info("loading plugin %s", settings.plugin_path)
    plugin = load_duplex_plugin(settings.plugin_path, encode_wire_audio)
    configure = getattr(plugin, "configure_from_settings", None)
    if configure is not None:
        configure(settings)
    engine = plugin.build_local_engine()
    validate_duplex_plugin_sampling(plugin, sampling_defaults=engine.sampling_defaults)
    log.info("loading Silero VAD")
    vad = SileroVadModel.shared()
    return LocalBackend(plugin, engine, max_sessions=settings.max_sessions, vad_model=vad)


async def start_backend(settings: Settings) -> DuplexBackend:
    backend = build_backend(settings)
    start = getattr(backend, "start", None)
    if start is not None:
        await start()  # a remote backend learns the model's capabilities here
    return backend


async def serve(settings: Settings) -> None:
    from agent.server import build_app, start_http

    backend = await start_backend(settings)
    runner = await start_http(build_app(backend, settings), settings.host, settings.port)
    print(f"duplex-agent is serving on http://{settings.host}:{settings.port}/  (Ctrl-C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        close = getattr(backend, "close", None)
        if close is not None:
            await close()


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
            from agent.livekit_worker import run_worker

            return run_worker(settings, dev=args.command == "dev")
    except MissingModelError as exc:
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
