"""Loading a plugin by its dotted path, and the checks made at load time."""

from __future__ import annotations

import dataclasses
import warnings
from importlib import import_module

from duplex_agent.plugins.contract.data_plane import DuplexDataPlane, EncodeAudio
from duplex_agent.plugins.contract.plugin import DuplexModelPlugin
from duplex_agent.plugins.contract.state import UNUSED_STATE_FIELDS, DefaultDuplexModelSessionState

#: Hooks of the upstream contract that this runtime never calls (it has no concurrent
#: turns, no draining stages, no retained commits, and silence continuation keeps its
#: own schedule); a plugin
#: that overrides one is told at load time instead of getting a silent no-op.
UNCALLED_PLUGIN_HOOKS = (
    "runtime_config_after_model_output",
    "release_concurrent_turn_requests",
    "draining_stage_ids",
)
UNCALLED_STATE_HOOKS = ("retain_committed_audio", "clear_continuation")
#: Where plugins lived before everything moved under ``duplex_agent``.
_OLD_PREFIXES = ("plugins.", "agent.", "webrtc.")


class PluginNotFoundError(ValueError):
    """The plugin path names no importable class."""


def duplex_plugin_type(path: str) -> type[DuplexModelPlugin]:
    """Import ``package.module.Class`` without building it (its ``options_type`` is read before the models load)."""
    path = _current_path(path)
    module_name, dot, attribute = path.rpartition(".")
    if not dot:
        raise ValueError(f"Invalid duplex plugin path: {path!r}")
    try:
        plugin_type = getattr(import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise PluginNotFoundError(f"cannot load the plugin {path!r}: {exc}") from None
    if not (isinstance(plugin_type, type) and issubclass(plugin_type, DuplexModelPlugin)):
        raise TypeError(f"{path!r} is not a DuplexModelPlugin")
    return plugin_type


def load_duplex_plugin(path: str, encode_audio: EncodeAudio) -> DuplexModelPlugin:
    """Import ``package.module.Class``, build it, and check it is a usable plugin."""
    plugin = duplex_plugin_type(path)(encode_audio)  # a DuplexModelPlugin subclass, or TypeError there
    if not plugin.plugin_id:
        raise TypeError("Duplex plugin must declare plugin_id")
    if not isinstance(getattr(plugin, "data_plane", None), DuplexDataPlane):
        raise TypeError("Duplex plugin must declare a DuplexDataPlane as data_plane")
    for hook in uncalled_hooks(plugin):
        warnings.warn(f"plugin {plugin.plugin_id!r} overrides {hook}, which this runtime never calls",
                      RuntimeWarning, stacklevel=2)
    for name in unused_state_fields(plugin):
        warnings.warn(f"plugin {plugin.plugin_id!r} sets its session state's {name}, which this runtime never reads",
                      RuntimeWarning, stacklevel=2)
    return plugin


def uncalled_hooks(plugin: DuplexModelPlugin) -> list[str]:
    """The overridden hooks of ``plugin`` (and its session state) that the runtime never calls."""
    found = [name for name in UNCALLED_PLUGIN_HOOKS
             if getattr(type(plugin), name) is not getattr(DuplexModelPlugin, name)]
    state_type = type(plugin.create_session_state())
    found += [f"{state_type.__name__}.{name}" for name in UNCALLED_STATE_HOOKS
              if getattr(state_type, name) is not getattr(DefaultDuplexModelSessionState, name)]
    return found


def unused_state_fields(plugin: DuplexModelPlugin) -> list[str]:
    """The fields of ``UNUSED_STATE_FIELDS`` that a fresh session state of ``plugin`` holds away from the default."""
    defaults = {f.name: f.default for f in dataclasses.fields(DefaultDuplexModelSessionState)}
    state = plugin.create_session_state()
    return [name for name in UNUSED_STATE_FIELDS if getattr(state, name, defaults[name]) != defaults[name]]


def _current_path(path: str) -> str:
    """A plugin path from before the move under ``duplex_agent`` still loads, with a warning."""
    if path.startswith(_OLD_PREFIXES):
        new = f"duplex_agent.{path}"
        warnings.warn(f"plugin path {path!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=3)
        return new
    return path


def validate_duplex_plugin_sampling(plugin: DuplexModelPlugin, *, sampling_defaults: tuple[object, ...]) -> None:
    """Fail at start when a plugin cannot give one sampling parameter per stage."""
    configured = plugin.configure_sampling_params(runtime_config={}, defaults=sampling_defaults)
    if not isinstance(configured, tuple):
        raise TypeError("Duplex plugin must return sampling parameters as a tuple")
    if len(configured) != len(sampling_defaults):
        raise ValueError("Duplex plugin must return one sampling parameter per stage")
    for stage_id, (value, default) in enumerate(zip(configured, sampling_defaults, strict=True)):
        if default is not None and not isinstance(value, type(default)):
            raise TypeError(
                f"Duplex plugin sampling parameter type mismatch for stage {stage_id}: "
                f"expected {type(default).__name__}, got {type(value).__name__}"
            )
