"""Loading plugins by path: the current namespace, the old paths, and hooks the runtime never calls."""

from __future__ import annotations

import warnings

import pytest

from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.plugins.contract import DefaultDuplexModelSessionState, load_duplex_plugin
from duplex_agent.plugins.scripted import ScriptedPlugin


class OutputWatchingPlugin(ScriptedPlugin):
    """Overrides a hook this runtime has no caller for."""

    def runtime_config_after_model_output(self, current, output_metadata):  # noqa: ANN001, ANN201
        return {"seen": dict(output_metadata)}


class RetainingState(DefaultDuplexModelSessionState):
    def retain_committed_audio(self, payload, *, operation_id, reserved_bytes=0):  # noqa: ANN001, ANN201
        super().retain_committed_audio(payload, operation_id=operation_id, reserved_bytes=reserved_bytes)


class RetainingPlugin(ScriptedPlugin):
    def create_session_state(self):  # noqa: ANN201
        state = super().create_session_state()
        return RetainingState(audio_buffer=state.audio_buffer)


def test_current_path_loads_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plugin = load_duplex_plugin("duplex_agent.plugins.scripted.ScriptedPlugin", as_float32_audio)
    assert isinstance(plugin, ScriptedPlugin)


def test_old_path_loads_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="duplex_agent.plugins.scripted.ScriptedPlugin"):
        plugin = load_duplex_plugin("plugins.scripted.ScriptedPlugin", as_float32_audio)
    assert isinstance(plugin, ScriptedPlugin)


def test_overridden_uncalled_plugin_hook_is_named_at_load():
    with pytest.warns(RuntimeWarning, match="runtime_config_after_model_output"):
        load_duplex_plugin(f"{__name__}.OutputWatchingPlugin", as_float32_audio)


def test_overridden_uncalled_state_hook_is_named_at_load():
    with pytest.warns(RuntimeWarning, match="RetainingState.retain_committed_audio"):
        load_duplex_plugin(f"{__name__}.RetainingPlugin", as_float32_audio)


class LockingPlugin(ScriptedPlugin):
    """Starts each session with a seed field set that this runtime never reads."""

    def create_session_state(self):  # noqa: ANN201
        state = super().create_session_state()
        state.context_locked = True
        return state


def test_a_state_field_the_runtime_never_reads_is_named_at_load():
    with pytest.warns(RuntimeWarning, match="context_locked, which this runtime never reads"):
        load_duplex_plugin(f"{__name__}.LockingPlugin", as_float32_audio)
