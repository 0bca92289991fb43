"""The one seam between ``DuplexModel.in_process`` and how plugins take their options.

An option is either one of the worker's own settings (``agent/app/settings.py``:
``max_sessions``...) or one the plugin declares in its ``options_type`` (``moshi_config``,
``device``, ``responder``...); both go through the worker's own bootstrap, so an in-process
model is configured exactly as ``duplex-agent serve --plugin NAME`` is, and a plugin whose
option has a worker setting's name is refused as the command line refuses it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from duplex_agent.agent.app.bootstrap import build_backend, plugin_options
from duplex_agent.agent.app.flags import check_option_names
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.ports import DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.plugins.contract.loading import duplex_plugin_type


def plugin_settings(plugin: str, options: dict[str, Any]) -> Settings:
    """Settings for ``plugin`` (an alias or a dotted path) with ``options``; TypeError naming a bad one,
    ValueError naming a plugin option that has a worker setting's name (it would hide the setting)."""
    settings = Settings(plugin=plugin)
    options_type = duplex_plugin_type(settings.plugin_path).options_type
    if options_type is not None:
        check_option_names(settings.plugin, options_type)
    settings.plugin_options = options_type() if options_type is not None else None
    worker = {f.name for f in fields(Settings)} - {"plugin", "plugin_options"}
    own = {f.name for f in fields(options_type)} if options_type is not None else set()
    for name, value in options.items():
        if name in own:
            setattr(settings.plugin_options, name, value)
        elif name in worker:
            setattr(settings, name, value)
        else:
            raise TypeError(f"unknown option {name!r} for plugin {plugin!r}; its own options: "
                            f"{', '.join(sorted(own)) or 'none'}; the worker's: {', '.join(sorted(worker))}")
    return settings


def build_plugin_backend(plugin: str, options: dict[str, Any]) -> DuplexBackend:
    """Load the plugin's models and engine (slow: call it off the event loop)."""
    return build_backend(plugin_settings(plugin, options))


def plugin_capabilities(plugin: str, options: dict[str, Any]) -> DuplexCapabilities:
    """What the plugin declares it can do with these options, read from a configured instance
    that loads no weights (configuring is cheap; the models load in ``build_local_engine``)."""
    settings = plugin_settings(plugin, options)
    instance = duplex_plugin_type(settings.plugin_path)(as_float32_audio)
    instance.configure(plugin_options(instance, settings), max_sessions=settings.max_sessions)
    return instance.capabilities(max_sessions=settings.max_sessions)
