"""Worker settings: flags override environment variables override defaults."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

PLUGIN_ALIASES = {
    "reference": "duplex_agent.plugins.reference.plugin.ReferencePlugin",
    "scripted": "duplex_agent.plugins.scripted.ScriptedPlugin",
}


_FIELD_TYPES = {"int": int, "float": float}


@dataclass(slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    #: A plugin alias (reference, scripted) or a dotted path to a DuplexModelPlugin class.
    plugin: str = "reference"
    #: Empty for the in-process model; a ws:// URL of a vLLM-Omni duplex endpoint otherwise.
    backend: str = ""
    backend_model: str = ""
    backend_api_key: str = ""
    #: A JSON file of session fields every remote session opens with (e.g. MiniCPM-o's ``ref_audio``).
    backend_session: str = ""
    #: Seconds without a server event while a reply plays before the reply is cancelled as stalled.
    backend_stall_timeout: float = 3.0
    max_sessions: int = 4
    #: Seconds a SIGTERM/SIGINT lets live calls finish before they are closed.
    drain_timeout: float = 60.0
    #: Reference model responder: echo | openai.
    responder: str = "echo"
    openai_base_url: str = ""
    openai_model: str = ""
    openai_api_key: str = ""
    #: Address ICE binds to for direct WebRTC peers; empty picks this machine's interface.
    ice_address: str = ""
    livekit_url: str = ""
    livekit_api_key: str = ""
    livekit_api_secret: str = ""
    agent_name: str = "duplex-agent"
    log_level: str = "INFO"

    @property
    def plugin_path(self) -> str:
        return PLUGIN_ALIASES.get(self.plugin, self.plugin)

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
            kind = _FIELD_TYPES.get(f.type, str)
            parser.add_argument(flag, dest=f.name, type=kind, default=getattr(self, f.name),
                                help=f"(env DUPLEX_{f.name.upper()}; default: %(default)s)")

    def apply(self, namespace: argparse.Namespace) -> Settings:
        for f in fields(self):
            if hasattr(namespace, f.name):
                setattr(self, f.name, getattr(namespace, f.name))
        return self
