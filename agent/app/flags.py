"""The flags of each ``duplex-agent`` subcommand: only the settings it uses, grouped, one line each.

``SETTING_FLAGS`` says, for every ``Settings`` field, its group, the subcommands that read
it and what it means. A field missing from it (a new setting) is shown under "other" on
the subcommands that load a model. The plugin's own options (its ``options_type``) get a
group of their own on those subcommands; none may have a setting's name (``check_option_names``).
"""

from __future__ import annotations

import argparse
from dataclasses import Field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from duplex_agent.agent.app.settings import (
    FLAG,
    SECRET_FIELDS,
    Settings,
    environment_names,
    parse_field,
)
from duplex_agent.plugins.contract.options import option_choices, option_help, option_is_secret

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SERVE, START, DEV, TOKEN, DIAL = "serve", "start", "dev", "token", "dial"
#: Subcommands that load a model (and so take the plugin's options).
MODEL_COMMANDS = (SERVE, START, DEV)
PAGE = (SERVE, DEV)  # subcommands that serve the page, WebRTC and the websocket

NETWORK, ACCESS, MODEL, TOOLS, LIVEKIT, WORKER, OTHER = (
    "network", "access", "model", "tools", "LiveKit", "worker", "other")
GROUP_TITLES = {
    NETWORK: "network: where the page, WebRTC and the websocket listen",
    ACCESS: "access: who may open sessions (see docs/security.md)",
    MODEL: "model: what answers the caller",
    TOOLS: "tools: what the agent may do during a WebRTC or LiveKit call",
    LIVEKIT: "LiveKit: the server this worker registers with",
    WORKER: "worker",
    OTHER: "other settings",
}


class SettingFlag(NamedTuple):
    group: str
    commands: tuple[str, ...]
    help: str
    choices: tuple[str, ...] = ()


SETTING_FLAGS: dict[str, SettingFlag] = {
    "host": SettingFlag(NETWORK, (*PAGE, START, TOKEN), "address every listener binds, livekit-agents' own "
                                                       "HTTP server too (0.0.0.0: every interface; then set a key)"),
    "port": SettingFlag(NETWORK, (*PAGE, TOKEN), "port of the page, signaling, the websocket and /metrics"),
    "ice_address": SettingFlag(NETWORK, PAGE, "address ICE binds to for direct WebRTC peers (empty: this machine's "
                                              "interface; aiortc skips 127.0.0.1)"),
    "opus_bitrate": SettingFlag(NETWORK, PAGE, "bits per second of the agent's voice to direct WebRTC peers "
                                               "(mono Opus, in-band FEC)"),
    "media_timeout": SettingFlag(NETWORK, PAGE, "seconds without the caller's audio packets after which a direct "
                                                "WebRTC call is ended with reason media_timeout (0: never)"),
    "echo_cancel": SettingFlag(NETWORK, PAGE, "cancel the agent's own voice in a direct WebRTC caller's audio "
                                              "(speakerphones; slows barge-in early in a call: docs/performance.md)"),
    "webrtc": SettingFlag(NETWORK, (SERVE,), "serve the page and WebRTC signaling; --no-webrtc: only the "
                                             "realtime websocket, /healthz and /metrics (no aiortc or PyAV needed)"),
    "tls_cert": SettingFlag(NETWORK, (*PAGE, TOKEN), "PEM certificate chain: serve HTTPS/WSS (with --tls-key)"),
    "tls_key": SettingFlag(NETWORK, PAGE, "PEM private key of --tls-cert"),
    "tls_self_signed": SettingFlag(NETWORK, (*PAGE, TOKEN), "make (and reuse) a certificate for this machine's "
                                                            "addresses: for trying the page from a phone"),
    "tls_dir": SettingFlag(NETWORK, PAGE, "where the self-signed certificate is kept "
                                          "(empty: ~/.cache/duplex-agent/tls)"),
    "metrics_port": SettingFlag(NETWORK, (*PAGE, START), "serve /metrics and /healthz on this port only, without "
                                                         "a key (0: on --port, behind the key; start: none)"),
    "metrics_host": SettingFlag(NETWORK, (*PAGE, START), "address of --metrics-port"),
    "api_key": SettingFlag(ACCESS, (*PAGE, TOKEN), "the key signaling, the websocket, tokens and metrics require "
                                                   "(empty: none)"),
    "api_key_file": SettingFlag(ACCESS, (*PAGE, TOKEN), "a file whose first line is the key, instead of --api-key"),
    "allow_unauthenticated": SettingFlag(ACCESS, PAGE, "serve a reachable address without a key, without "
                                                       "the warning"),
    "token_ttl": SettingFlag(ACCESS, (*PAGE, TOKEN), "seconds a session token lives (at most 24 h)"),
    "allowed_origins": SettingFlag(ACCESS, PAGE, "other page origins allowed to signal and open websockets "
                                                 "(scheme://host[:port], comma-separated; * for any)"),
    "sessions_per_minute": SettingFlag(ACCESS, PAGE, "new sessions one client address may open per minute "
                                                     "(0: no limit)"),
    "sessions_per_address": SettingFlag(ACCESS, PAGE, "sessions one client address may hold at once "
                                                      "(0: only --max-sessions)"),
    "plugin": SettingFlag(MODEL, MODEL_COMMANDS, "the in-process model: reference (Whisper + echo or an LLM + Piper, "
                                                 "CPU), scripted (tones, for tests), moshi (Kyutai Moshi, torch), or "
                                                 "package.module.Class; `--plugin NAME --help` lists its options"),
    "max_sessions": SettingFlag(MODEL, MODEL_COMMANDS, "conversations at once; one more is refused "
                                                       "(resource_exhausted)"),
    "max_cpu": SettingFlag(MODEL, MODEL_COMMANDS, "refuse new calls (503 overloaded; a LiveKit worker reports "
                                                  "itself full) while the machine's CPUs are busier than this "
                                                  "share over 5 s, e.g. 0.9 (0: never)"),
    "backend": SettingFlag(MODEL, MODEL_COMMANDS, "ws://HOST:PORT/v1/realtime?duplex=1 of a vLLM-Omni duplex "
                                                  "server, instead of the in-process --plugin; repeat it (or "
                                                  "@FILE, one URL a line, re-read on SIGHUP) for several: each "
                                                  "call goes to the one with the most free sessions"),
    "backend_model": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: the model the server serves"),
    "backend_api_key": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: the server's key"),
    "backend_session": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: a JSON file of session fields every session "
                                                          "opens with (e.g. MiniCPM-o's ref_audio)"),
    "backend_stall_timeout": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: seconds without a server event "
                                                                "mid-reply before the reply is cancelled"),
    "backend_connect_timeout": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: seconds a backend's websocket "
                                                                  "handshake may take before it counts as gone"),
    "backend_unresponsive_timeout": SettingFlag(MODEL, MODEL_COMMANDS, "--backend: seconds a live call's backend "
                                                                       "may answer nothing, not even a ping, before "
                                                                       "its host counts as gone (a frozen or cut-off "
                                                                       "host sends no reset)"),
    "backend_lost_grace": SettingFlag(MODEL, MODEL_COMMANDS, "several --backend: seconds a call whose backend is "
                                                             "lost looks for another before it ends"),
    "tools": SettingFlag(TOOLS, MODEL_COMMANDS, "a module (package.module) of livekit-agents @function_tool "
                                               "functions, and an optional `instructions` string, that the model "
                                               "may call (it needs a model that calls tools)"),
    "tool_timeout": SettingFlag(TOOLS, MODEL_COMMANDS, "seconds one tool may run; then the model is told it timed "
                                                       "out"),
    "hold_after": SettingFlag(TOOLS, MODEL_COMMANDS, "seconds a tool's answer may take before the caller hears a "
                                                     "soft hold sound (until the answer plays)"),
    "livekit_url": SettingFlag(LIVEKIT, (START, DEV, DIAL), "the LiveKit server's ws:// or wss:// URL"),
    "livekit_api_key": SettingFlag(LIVEKIT, (START, DEV, DIAL), "the LiveKit API key"),
    "livekit_api_secret": SettingFlag(LIVEKIT, (START, DEV, DIAL), "the LiveKit API secret"),
    "agent_name": SettingFlag(LIVEKIT, (START, DEV, DIAL), "the agent name jobs are dispatched to"),
    "resume_grace_s": SettingFlag(WORKER, PAGE, "seconds a session outlives its dropped connection, waiting to be "
                                                "resumed (0: no resume)"),
    "drain_timeout": SettingFlag(WORKER, MODEL_COMMANDS, "seconds SIGTERM/SIGINT lets live calls finish before "
                                                         "they are closed"),
    "log_level": SettingFlag(WORKER, MODEL_COMMANDS, "DEBUG, INFO, WARNING or ERROR"),
}


#: Flags that may be given several times; their values are joined by commas (as the environment writes them).
REPEATABLE_FIELDS = frozenset({"backend"})


class JoinRepeated(argparse.Action):
    """A repeated flag's values joined by commas."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        seen = f"_{self.dest}_given"
        joined = f"{getattr(namespace, self.dest)},{values}" if getattr(namespace, seen, False) else str(values)
        setattr(namespace, self.dest, joined)
        setattr(namespace, seen, True)


#: Names the command line keeps for itself: --help, and the subcommand (``args.command``).
PARSER_NAMES = frozenset({"help", "command"})


def check_option_names(plugin: str, options_type: type[DataclassInstance]) -> None:
    """ValueError naming the first of the plugin's options that has a worker setting's name (or one the
    parser keeps): it would be a second ``--name`` (argparse refuses it, --help included) and read the
    setting's environment variable."""
    settings = {f.name: f for f in fields(Settings)}
    for f in fields(options_type):
        if f.name in settings:
            flag = f" (--{f.name.replace('_', '-')})" if settings[f.name].metadata.get(FLAG, True) else ""
            kept = f"the worker setting {f.name}{flag}"
        elif f.name in PARSER_NAMES:
            kept = f"a name the command line keeps for itself (--{f.name})"
        else:
            continue
        raise ValueError(f"the plugin {plugin!r} declares an option {f.name!r} in {options_type.__name__}, "
                         f"but that is {kept}: the plugin must give its option another name")


def setting_flag(name: str) -> SettingFlag:
    return SETTING_FLAGS.get(name, SettingFlag(OTHER, MODEL_COMMANDS, ""))


def add_setting_arguments(parser: argparse.ArgumentParser, settings: Settings, command: str, *,
                          plugin_title: str = "", plugin_options: DataclassInstance | None = None) -> None:
    """The settings ``command`` reads, as flags under their groups' headings, in ``GROUP_TITLES``'
    order; the plugin's options (if given) right after the model's group."""
    chosen = [f for f in fields(settings) if f.metadata.get(FLAG, True) and command in setting_flag(f.name).commands]
    for group_name, title in GROUP_TITLES.items():
        members = [f for f in chosen if setting_flag(f.name).group == group_name]
        if members:
            group = parser.add_argument_group(title)
            for f in members:
                flag = setting_flag(f.name)
                add_field_argument(group, f, getattr(settings, f.name), flag.help,
                                   choices=flag.choices, secret=f.name in SECRET_FIELDS)
        if group_name == MODEL and plugin_options is not None:
            add_option_arguments(parser, plugin_title, plugin_options)


def add_option_arguments(parser: argparse.ArgumentParser, title: str, options: DataclassInstance) -> None:
    """A plugin's options (a dataclass instance holding the defaults) as flags under ``title``."""
    group = parser.add_argument_group(title)
    for f in fields(options):
        add_field_argument(group, f, getattr(options, f.name), option_help(f),
                           choices=option_choices(f), secret=option_is_secret(f))


def add_field_argument(group: argparse._ArgumentGroup, f: Field[Any], default: object, meaning: str, *,
                       choices: tuple[str, ...] = (), secret: bool = False) -> None:
    flag = "--" + f.name.replace("_", "-")
    env = " or ".join(reversed(environment_names(f.name)))
    lead = f"{meaning}; " if meaning else ""
    if secret:
        # The value is never echoed: argparse shows defaults only through %(default)s.
        group.add_argument(flag, dest=f.name, default=default, metavar="SECRET",
                           help=f"{lead}a secret: set {env} rather than the flag (visible in ps); never shown")
    elif f.name in REPEATABLE_FIELDS:
        group.add_argument(flag, dest=f.name, action=JoinRepeated, default=default,
                           help=f"{lead}repeatable; env {env}, comma-separated; default: %(default)s")
    elif f.type == "bool":
        group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                           help=f"{lead}env {env}; default: %(default)s")
    else:
        group.add_argument(flag, dest=f.name, type=lambda text: parse_field(f, text), default=default,
                           choices=choices or None, metavar=f"{{{','.join(choices)}}}" if choices else None,
                           help=f"{lead}env {env}; default: %(default)s")
