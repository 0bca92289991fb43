"""``duplex-agent``: serve the embedded worker, run as a LiveKit worker, or mint a session token."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
from typing import TYPE_CHECKING

from duplex_agent.agent.app.bootstrap import options_from_environment
from duplex_agent.agent.app.flags import (
    DEV,
    DIAL,
    MODEL_COMMANDS,
    SERVE,
    START,
    TOKEN,
    add_setting_arguments,
    check_option_names,
)
from duplex_agent.agent.app.settings import Settings, read_arguments
from duplex_agent.agent.app.shutdown import ShutdownSignals, drain
from duplex_agent.agent.app.tools_setup import start_serving_backend
from duplex_agent.agent.models.model_errors import MissingModelError, ModelStartError
from duplex_agent.plugins.contract import duplex_plugin_type

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
    from duplex_agent.agent.app.heap import keep_the_heap
    from duplex_agent.agent.app.server import build_app, start_http, tls_context
    from duplex_agent.agent.session.cpu_guard import CpuGuard

    warn_if_open(settings)
    ssl_context = tls_context(settings)  # before the models load: a bad certificate fails at once
    cpu_guard = CpuGuard(settings.max_cpu)  # a bad --max-cpu too
    signals = ShutdownSignals()
    signals.install()
    backend, tools = await start_serving_backend(settings)
    cpu_guard.start()
    runner = await start_http(build_app(backend, settings, with_webrtc=settings.webrtc, tools=tools,
                                        cpu_guard=cpu_guard), settings.host, settings.port, ssl_context=ssl_context)
    heap = keep_the_heap()
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
        heap.cancel()
        cpu_guard.stop()
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


COMMANDS = {
    SERVE: "serve the page, WebRTC and the realtime websocket on one port (the embedded default)",
    START: "run as a LiveKit worker (production): take jobs dispatched to --agent-name",
    DEV: "run as a LiveKit worker (development): verbose, and serve the page, which gets room tokens from it",
    TOKEN: "print a short-lived session token and page links carrying it (reads the key from the environment)",
    DIAL: "place an outbound phone call through LiveKit's SIP service, served by a worker (start or dev)",
}
EXAMPLES = """\
examples:
  duplex-agent serve                                  the page on http://127.0.0.1:8080/ (replies by echo)
  duplex-agent serve --responder openai --openai-base-url http://127.0.0.1:8000/v1 --openai-model M
  duplex-agent serve --plugin moshi --moshi-config tiny --device cpu   Moshi with random weights (a demo)
  duplex-agent dev --livekit-url ws://127.0.0.1:7880  LiveKit (make livekit-dev starts a local server too)
  duplex-agent dial +15551234567 --trunk ST_xxx       a worker calls that number through a LiveKit SIP trunk
  duplex-agent SUBCOMMAND --help                      that subcommand's options"""


class PluginOptions:
    """The chosen plugin's option declaration, read before the parser is built (so --help shows it)."""

    def __init__(self, settings: Settings) -> None:
        self.values: DataclassInstance | None = None
        self.error = ""
        try:
            options_type = duplex_plugin_type(settings.plugin_path).options_type
            if options_type is not None:
                check_option_names(settings.plugin, options_type)
        except (ValueError, TypeError) as exc:
            self.error = str(exc)
            return
        if options_type is not None:
            self.values = options_from_environment(options_type)


def chosen_plugin(argv: list[str] | None, settings: Settings) -> str:
    """--plugin as the command line gives it (anywhere in it), else the setting's."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", default=settings.plugin)
    return pre.parse_known_args(argv)[0].plugin


def build_parser(settings: Settings, plugin: PluginOptions) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-agent", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, text in COMMANDS.items():
        model = name in MODEL_COMMANDS
        command = commands.add_parser(name, help=text, description=text, usage=f"duplex-agent {name} [options]",
                                      epilog=f"note: {plugin.error}" if plugin.error and model else None)
        add_setting_arguments(command, settings, name, plugin_title=f"model: the options of --plugin {settings.plugin}",
                              plugin_options=plugin.values if model else None)
        if name == DIAL:
            from duplex_agent.agent.app.dial_command import add_dial_arguments

            add_dial_arguments(command)
        if name == TOKEN:
            command.add_argument("--ttl", type=float, default=None,
                                 help="seconds this token opens sessions for (default: --token-ttl; at most 24 h); "
                                      "a session opened in time runs on")
    return parser


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_env()
    settings.plugin = chosen_plugin(argv, settings)
    plugin = PluginOptions(settings)
    args = build_parser(settings, plugin).parse_args(argv)
    settings.apply(args)
    if plugin.values is not None:
        read_arguments(plugin.values, args)
        settings.plugin_options = plugin.values
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings.resolved_api_key()
    except OSError as exc:
        print(f"duplex-agent: cannot read the API key file: {exc.strerror} ({settings.api_key_file})", file=sys.stderr)
        return 2
    if plugin.error and args.command in MODEL_COMMANDS and not settings.backend:
        print(f"duplex-agent: {plugin.error}", file=sys.stderr)
        return 2
    try:
        if args.command == TOKEN:
            return print_token(settings, args.ttl)
        if args.command == DIAL:
            from duplex_agent.agent.app.dial_command import run_dial

            return run_dial(settings, args)
        if args.command == SERVE:
            asyncio.run(serve(settings))
        else:
            try:
                from duplex_agent.agent.app.livekit_worker import run_worker
            except ImportError as exc:
                print(f"duplex-agent: {args.command} needs the livekit extra ({exc}): run `make install`, or "
                      "pip install 'duplex-agent[livekit]'", file=sys.stderr)
                return 2
            if args.command == DEV:  # dev also serves the page and mints LiveKit tokens for it
                warn_if_open(settings)
            return run_worker(settings, dev=args.command == DEV)
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
