"""The one seam between ``DuplexModel.in_process`` and how plugins take their options.

Plugin options are the worker's own settings (``agent/app/settings.py``: ``moshi_config``,
``device``, ``responder``, ``max_sessions``...), built into a backend by the worker's own
bootstrap, so an in-process model is configured exactly as ``duplex-agent serve`` is.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.session.ports import DuplexBackend


def plugin_settings(plugin: str, options: dict[str, Any]) -> Settings:
    """Settings for ``plugin`` (an alias or a dotted path) with ``options``; TypeError naming a bad one."""
    settings = Settings(plugin=plugin)
    known = {f.name for f in fields(Settings)}
    for name, value in options.items():
        if name not in known:
            raise TypeError(f"unknown plugin option {name!r}; the options are the worker's settings: "
                            + ", ".join(sorted(known)))
        setattr(settings, name, value)
    return settings


def build_plugin_backend(plugin: str, options: dict[str, Any]) -> DuplexBackend:
    """Load the plugin's models and engine (slow: call it off the event loop)."""
    return build_backend(plugin_settings(plugin, options))
