"""``duplex-agent``: serve the embedded worker, run as a LiveKit worker, or mint a session token."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys

from duplex_agent.agent.app.bootstrap import start_backend
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.app.shutdown import ShutdownSignals, drain
from duplex_agent.agent.models.model_errors import MissingModelError, ModelStartError

log = logging.getLogger("duplex_agent")

UNAUTHENTICATED_WARNING = """\
************************************************************************
WARNING: duplex-agent is serving {host} with NO API KEY.
Anyone who can reach this port can open sessions, use up --max-sessions
and spend the model's compute. Set DUPLEX_API_KEY (or --api-key-file)
to require a key; --allow-unauthenticated silences this warning.
************************************************************************"""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname or a wildcard: assume it is reachable


def warn_if_open(settings: Settings) -> None:
    """The loud warning for a reachable address served without a key."""
    if is_loopback(settings.host) or settings.allow_unauthenticated or settings.resolved_api_key():
        return
    print(UNAUTHENTICATED_WARNING.format(host=settings.host), file=sys.stderr, flush=True)
    log.warning("serving %s without an API key (--allow-unauthenticated silences this)", settings.host)


def page_urls(settings: Settings) -> list[str]:
    from duplex_agent.agent.app.access.certificates import machine_addresses

    scheme = "https" if settings.tls_enabled else "http"
    hosts = [settings.host] if settings.host not in ("0.0.0.0", "::", "") else [
        a for a in machine_addresses() if ":" not in a]
    return [f"{scheme}://{h}:{settings.port}/" for h in hosts]


async def serve(settings: Settings) -> None:
    from duplex_agent.agent.app.server import build_app, start_http, tls_context

    warn_if_open(settings)
    ssl_context = tls_context(settings)  # before the models load: a bad certificate fails at once
    signals = ShutdownSignals()
    signals.install()
    backend = await start_backend(settings)
    runner = await start_http(build_app(backend, settings, with_webrtc=settings.webrtc), settings.host, settings.port, ssl_context=ssl_context)
    print(f"duplex-agent is serving on {'  '.join(page_urls(settings))}  (Ctrl-C to stop)", flush=True)
    if settings.resolved_api_key():
        print("duplex-agent: an API key is required; `duplex-agent token` prints a page link with a "
              "short-lived session token", flush=True)
    if settings.metrics_port:
        print(f"duplex-agent: /metrics and /healthz are on http://{settings.metrics_host}:{settings.metrics_port}/",
              flush=True)
    try:
        await signals.requested.wait()
        left = await drain(backend, settings.drain_timeout)
        if left:
            log.warning("drain timeout: closing %d live session(s)", left)
    finally:
        await backend.close()  # live sessions end with session.closed (shutdown)
        await runner.cleanup()


def print_token(settings: Settings, ttl_s: float | None) -> int:
    """Mint a session token from the key in the environment and print page links carrying it."""
    from duplex_agent.agent.app.access.credentials import AccessKeys

    key = settings.resolved_api_key()
    if not key:
        print("duplex-agent: no API key (set DUPLEX_API_KEY or DUPLEX_API_KEY_FILE)", file=sys.stderr)
        return 2
    token, expires = AccessKeys(key, token_ttl_s=settings.token_ttl).mint(ttl_s)
    print(token)
    for url in page_urls(settings):
        print(f"{url}#token={token}")
    return 0


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_env()
    parser = argparse.ArgumentParser(prog="duplex-agent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "serve the page, WebRTC and the realtime websocket on one port"),
                       ("start", "run as a LiveKit worker (production)"),
                       ("dev", "run as a LiveKit worker (development: verbose, mints tokens for the page)"),
                       ("token", "print a short-lived session token and page links carrying it")):
        command = commands.add_parser(name, help=text)
        settings.add_arguments(command)
        if name == "token":
            command.add_argument("--ttl", type=float, default=None, help="lifetime in seconds (default: --token-ttl)")
    args = parser.parse_args(argv)
    settings.apply(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings.resolved_api_key()
    except OSError as exc:
        print(f"duplex-agent: cannot read the API key file: {exc.strerror} ({settings.api_key_file})", file=sys.stderr)
        return 2
    try:
        if args.command == "token":
            return print_token(settings, args.ttl)
        if args.command == "serve":
            asyncio.run(serve(settings))
        else:
            from duplex_agent.agent.app.livekit_worker import run_worker

            if args.command == "dev":  # dev also serves the page and mints LiveKit tokens for it
                warn_if_open(settings)
            return run_worker(settings, dev=args.command == "dev")
    except (MissingModelError, ModelStartError) as exc:
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # settings that cannot work together (TLS files, token lifetime)
        print(f"duplex-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
