"""Worker settings: flags override environment variables override defaults.

Every field is a flag ``--field-name`` and an environment variable ``DUPLEX_FIELD_NAME``
(``livekit_*`` also as ``LIVEKIT_*``); a plugin's own settings are its ``options_type``,
read the same way (``read_environment``, ``read_arguments``). Secrets (``SECRET_FIELDS``)
are read from the environment or a file; ``--help`` never shows their values and ``repr``
leaves them out, so they cannot reach a log.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PLUGIN_ALIASES = {
    "reference": "duplex_agent.plugins.reference.plugin.ReferencePlugin",
    "scripted": "duplex_agent.plugins.scripted.ScriptedPlugin",
    "moshi": "duplex_agent.plugins.moshi.plugin.MoshiPlugin",
}

#: Fields whose values are secrets: never shown in --help, repr or logs.
SECRET_FIELDS = frozenset({"api_key", "backend_api_key", "livekit_api_secret"})
#: Field metadata: False for a field that is no flag or environment variable.
FLAG = "flag"
_TRUE = {"1", "true", "yes", "on"}


def _parse_bool(text: str) -> bool:
    return text.strip().lower() in _TRUE


_FIELD_TYPES: dict[str, Callable[[str], object]] = {"int": int, "float": float, "bool": _parse_bool}


def _secret() -> str:
    return field(default="", repr=False)


@dataclass(slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    #: A plugin alias (reference, scripted, moshi) or a dotted path to a DuplexModelPlugin class.
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
    #: Seconds a live call's backend may answer nothing, not even a ping, before its host counts as gone.
    backend_unresponsive_timeout: float = 1.5
    #: Seconds a call whose backend is lost looks for another before it ends (several backends).
    backend_lost_grace: float = 10.0
    #: Whether the backends' model calls tools ("yes", "no"; empty: as the server's capabilities say,
    #: and vLLM-Omni's say it only through whether its model's request resumes), and whether it
    #: answers their outputs by itself (else the caller of a tool sends ``response.create``).
    backend_tools: str = ""
    backend_replies_to_tool_output: str = ""
    max_sessions: int = 4
    #: Refuse new calls while the machine's CPUs are busier than this share over the last few
    #: seconds (0: never; 0.9 leaves a saturated machine to the calls it has).
    max_cpu: float = 0.0
    #: A module (package.module) of livekit-agents function tools the model may call; WebRTC and
    #: LiveKit callers' calls run them at the edge. Empty: no tools.
    tools: str = ""
    #: Seconds one tool may run before the model is told it timed out.
    tool_timeout: float = 10.0
    #: Seconds a call waits for a tool's answer before the caller hears the hold sound.
    hold_after: float = 1.5
    #: Seconds a realtime session outlives its dropped websocket, waiting for session.resume (0: no resume).
    resume_grace_s: float = 30.0
    #: Seconds a SIGTERM/SIGINT lets live calls finish before they are closed.
    drain_timeout: float = 60.0
    #: Address ICE binds to for direct WebRTC peers; empty picks this machine's interface.
    ice_address: str = ""
    #: Bits per second of the agent's Opus voice on direct WebRTC peers (mono, in-band FEC).
    opus_bitrate: int = 32000
    #: Seconds without the caller's RTP after which a direct WebRTC call is ended (error and
    #: session.closed ``media_timeout`` on its data channel); 0: never.
    media_timeout: float = 20.0
    #: Cancel the agent's echo in a direct WebRTC caller's audio (WebRTC's AEC3, the livekit extra).
    echo_cancel: bool = False
    #: Serve the page and WebRTC signaling; --no-webrtc serves the realtime websocket, /healthz and
    #: /metrics only (no aiortc, PyAV or LiveKit SDK needed: a GPU host that carries few wheels).
    webrtc: bool = True
    livekit_url: str = ""
    livekit_api_key: str = ""
    livekit_api_secret: str = _secret()
    agent_name: str = "duplex-agent"
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
    #: The plugin's own settings (an instance of its ``options_type``), set by the CLI; None: read
    #: from the environment when the plugin loads. Not a flag itself: the plugin declares its flags.
    plugin_options: DataclassInstance | None = field(default=None, metadata={FLAG: False})

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
        settings = cls()
        read_environment(settings, os.environ if environ is None else environ)
        return settings

    def apply(self, namespace: argparse.Namespace) -> Settings:
        read_arguments(self, namespace)
        return self


def environment_names(name: str) -> tuple[str, ...]:
    """The variables a field is read from; a later one found wins (``LIVEKIT_URL`` over ``DUPLEX_LIVEKIT_URL``)."""
    return (f"DUPLEX_{name.upper()}", name.upper()) if name.startswith("livekit") else (f"DUPLEX_{name.upper()}",)


def parse_field(f: Field[Any], text: str) -> object:
    # Field types are the annotations' text (``from __future__ import annotations``): "int", "float", ...
    return (_FIELD_TYPES.get(f.type, str) if isinstance(f.type, str) else str)(text)


def read_environment(target: DataclassInstance, environ: Mapping[str, str]) -> None:
    """Set the dataclass ``target``'s fields from their environment variables."""
    for f in fields(target):
        if f.metadata.get(FLAG, True):
            for name in environment_names(f.name):
                if name in environ:
                    setattr(target, f.name, parse_field(f, environ[name]))


def read_arguments(target: DataclassInstance, namespace: argparse.Namespace) -> None:
    """Set the dataclass ``target``'s fields from the parsed command line (those it holds)."""
    for f in fields(target):
        if f.metadata.get(FLAG, True) and hasattr(namespace, f.name):
            setattr(target, f.name, getattr(namespace, f.name))
