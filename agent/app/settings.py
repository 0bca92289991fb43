"""Worker settings: flags override environment variables override defaults.

Secrets (``SECRET_FIELDS``) are read from the environment or a file; ``--help``
never shows their values and ``repr`` leaves them out, so they cannot reach a log.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

PLUGIN_ALIASES = {
    "reference": "duplex_agent.plugins.reference.plugin.ReferencePlugin",
    "scripted": "duplex_agent.plugins.scripted.ScriptedPlugin",
    "moshi": "duplex_agent.plugins.moshi.plugin.MoshiPlugin",
}

#: Fields whose values are secrets: never shown in --help, repr or logs.
SECRET_FIELDS = frozenset({"api_key", "backend_api_key", "openai_api_key", "livekit_api_secret"})
_TRUE = {"1", "true", "yes", "on"}


def _parse_bool(text: str) -> bool:
    return text.strip().lower() in _TRUE


_FIELD_TYPES = {"int": int, "float": float, "bool": _parse_bool}
#: Flags that may be given several times; their values are joined by commas (as the environment writes them).
REPEATABLE_FIELDS = frozenset({"backend"})


class _JoinRepeated(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        seen = f"_{self.dest}_given"
        joined = f"{getattr(namespace, self.dest)},{values}" if getattr(namespace, seen, False) else str(values)
        setattr(namespace, self.dest, joined)
        setattr(namespace, seen, True)


def _secret() -> str:
    return field(default="", repr=False)


@dataclass(slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    #: A plugin alias (reference, scripted) or a dotted path to a DuplexModelPlugin class.
    plugin: str = "reference"
    #: Empty for the in-process model; else ws:// URLs of vLLM-Omni duplex endpoints: the flag repeated,
    #: a comma-separated list, or @FILE (one URL per line, re-read on SIGHUP). With several, each new call
    #: goes to the one with the most free sessions and a call moves on when its backend is lost.
    backend: str = ""
    backend_model: str = ""
    backend_api_key: str = _secret()
    #: A JSON file of session fields every remote session opens with (e.g. MiniCPM-o's ``ref_audio``).
    backend_session: str = ""
    #: Seconds without a server event while a reply plays before the reply is cancelled as stalled.
    backend_stall_timeout: float = 3.0
    #: Seconds a backend's websocket handshake may take before the backend counts as gone.
    backend_connect_timeout: float = 5.0
    #: Seconds a call whose backend is lost looks for another before it ends (several backends).
    backend_lost_grace: float = 10.0
    max_sessions: int = 4
    #: Seconds a realtime session outlives its dropped websocket, waiting for session.resume (0: no resume).
    resume_grace_s: float = 30.0
    #: Seconds a SIGTERM/SIGINT lets live calls finish before they are closed.
    drain_timeout: float = 60.0
    #: Reference model responder: echo | openai.
    responder: str = "echo"
    #: Earlier turns of the call the responder sees (a bounded context, not the whole call).
    responder_max_turns: int = 8
    openai_base_url: str = ""
    openai_model: str = ""
    openai_api_key: str = _secret()
    #: Address ICE binds to for direct WebRTC peers; empty picks this machine's interface.
    ice_address: str = ""
    #: Bits per second of the agent's Opus voice on direct WebRTC peers (mono, in-band FEC).
    opus_bitrate: int = 32000
    #: The caller's receive buffer on direct WebRTC peers: adaptive (ours: jitter-following delay,
    #: Opus in-band FEC, libopus concealment) or aiortc (aiortc's own, to compare).
    receive_buffer: str = "adaptive"
    #: Serve the page and WebRTC signaling; --no-webrtc serves the realtime websocket, /healthz and
    #: /metrics only (no aiortc, PyAV or LiveKit SDK needed: a GPU host that carries few wheels).
    webrtc: bool = True
    livekit_url: str = ""
    livekit_api_key: str = ""
    livekit_api_secret: str = _secret()
    agent_name: str = "duplex-agent"
    #: Moshi (--plugin moshi): a Hugging Face repo read from the local cache only, or explicit files.
    moshi_repo: str = "kyutai/moshiko-pytorch-bf16"
    moshi_weights: str = ""
    mimi_weights: str = ""
    moshi_tokenizer: str = ""
    #: "tiny" (random weights, for tests and demos), a config.json path, or empty for the checkpoint's own.
    moshi_config: str = ""
    #: Where an in-process torch model runs: auto (CUDA when present), cpu, cuda, cuda:N.
    device: str = "auto"
    log_level: str = "INFO"
    #: The key signaling, the websocket, tokens and metrics require (empty: no authentication).
    api_key: str = _secret()
    #: A file holding the key (first line), instead of api_key.
    api_key_file: str = ""
    #: Serve a non-loopback address without a key, without the warning.
    allow_unauthenticated: bool = False
    #: Lifetime of the session tokens POST /api/token mints, in seconds.
    token_ttl: float = 300.0
    #: Origins (scheme://host[:port], comma-separated) allowed to signal and open websockets
    #: besides the server's own; "*" allows any.
    allowed_origins: str = ""
    #: New sessions one client address may open per minute (0: no limit).
    sessions_per_minute: int = 60
    #: Sessions one client address may hold open at once (0: only --max-sessions applies).
    sessions_per_address: int = 0
    #: Serve /metrics and /healthz only on this port (no key there); 0 keeps them on --port,
    #: behind the key when one is set.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    #: PEM certificate chain and private key: serve HTTPS/WSS.
    tls_cert: str = ""
    tls_key: str = ""
    #: Make (and reuse) a certificate for this machine's addresses: for trying the page from a phone.
    tls_self_signed: bool = False
    #: Where the self-signed certificate is kept (default ~/.cache/duplex-agent/tls).
    tls_dir: str = ""

    @property
    def plugin_path(self) -> str:
        return PLUGIN_ALIASES.get(self.plugin, self.plugin)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_self_signed or self.tls_cert)

    def resolved_api_key(self) -> str:
        """The key from api_key, else from the first line of api_key_file ("" when neither is set)."""
        if self.api_key:
            return self.api_key
        if self.api_key_file:
            lines = Path(self.api_key_file).read_text().splitlines()
            return lines[0].strip() if lines else ""
        return ""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        environ = dict(os.environ if environ is None else environ)
        settings = cls()
        for f in fields(cls):
            for name in (f"DUPLEX_{f.name.upper()}", f.name.upper() if f.name.startswith("livekit") else ""):
                if name and name in environ:
                    setattr(settings, f.name, _FIELD_TYPES.get(f.type, str)(environ[name]))
        return settings

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for f in fields(self):
            flag = "--" + f.name.replace("_", "-")
            env = f"DUPLEX_{f.name.upper()}"
            if f.name.startswith("livekit"):
                env = f"{f.name.upper()} or {env}"
            if f.type == "bool":
                parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                    default=getattr(self, f.name), help=f"(env {env}; default: %(default)s)")
            elif f.name in REPEATABLE_FIELDS:
                parser.add_argument(flag, dest=f.name, action=_JoinRepeated, default=getattr(self, f.name),
                                    help=f"repeatable (env {env}, comma-separated; default: %(default)s)")
            elif f.name in SECRET_FIELDS:
                # The value is never echoed: argparse shows defaults only through %(default)s.
                parser.add_argument(flag, dest=f.name, default=getattr(self, f.name), metavar="SECRET",
                                    help=f"secret: set {env} in the environment rather than on the command line "
                                         "(visible in ps); its value is never shown")
            else:
                parser.add_argument(flag, dest=f.name, type=_FIELD_TYPES.get(f.type, str),
                                    default=getattr(self, f.name), help=f"(env {env}; default: %(default)s)")

    def apply(self, namespace: argparse.Namespace) -> Settings:
        for f in fields(self):
            if hasattr(namespace, f.name):
                setattr(self, f.name, getattr(namespace, f.name))
        return self
