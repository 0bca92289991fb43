"""Builds the backend the settings ask for: an in-process plugin, a remote vLLM-Omni server, or a pool of them."""

from __future__ import annotations

import logging
import os

from duplex_agent.agent.app.settings import Settings, read_environment
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.ports import DuplexBackend
from duplex_agent.plugins.contract import DuplexModelPlugin

log = logging.getLogger("duplex_agent")


def build_backend(settings: Settings) -> DuplexBackend:
    """The backend the settings ask for; loads models (once) with progress on the log."""
    if settings.backend:
        import json
        from pathlib import Path

        from duplex_agent.agent.remote.backend import RemoteBackend
        from duplex_agent.agent.remote.conversation import RemoteOptions
        from duplex_agent.agent.remote.pool import BackendList, BackendPool

        session = json.loads(Path(settings.backend_session).read_text()) if settings.backend_session else None
        backends = BackendList(settings.backend)
        several = backends.file is not None or len(backends.urls()) > 1
        # In a pool a host that refuses or never answers is gone at once: the call moves to another.
        options = RemoteOptions(stall_timeout_s=settings.backend_stall_timeout,
                                connect_timeout_s=settings.backend_connect_timeout,
                                resume_gives_up_unreachable=several)

        def remote(url: str) -> RemoteBackend:
            return RemoteBackend(url, model=settings.backend_model, api_key=settings.backend_api_key,
                                 max_sessions=settings.max_sessions, session=session, options=options)

        if not several:
            return remote(backends.urls()[0])
        return BackendPool(backends, remote, lost_grace_s=settings.backend_lost_grace)
    from duplex_agent.agent.models.end_of_turn import EndOfTurnModel
    from duplex_agent.agent.models.vad import SileroVadModel
    from duplex_agent.agent.session.local_backend import LocalBackend
    from duplex_agent.plugins.contract import load_duplex_plugin, validate_duplex_plugin_sampling

    log.info("loading plugin %s", settings.plugin_path)
    plugin = load_duplex_plugin(settings.plugin_path, as_float32_audio)
    plugin.configure(plugin_options(plugin, settings), max_sessions=settings.max_sessions)
    engine = plugin.build_local_engine()
    from duplex_agent.agent.metrics import FRAME_OVERRUNS

    engine.on_overrun = lambda lag_ms: FRAME_OVERRUNS.inc()  # a frame-clocked engine counts its late steps
    validate_duplex_plugin_sampling(plugin, sampling_defaults=engine.sampling_defaults)
    log.info("loading Silero VAD")
    vad = SileroVadModel.shared()
    if plugin.capabilities(max_sessions=settings.max_sessions).input_mode == "turn":
        log.info("loading the end-of-turn model")  # here, not in the first session's loop
        EndOfTurnModel.shared()
    return LocalBackend(plugin, engine, max_sessions=settings.max_sessions, vad_model=vad)


def plugin_options(plugin: DuplexModelPlugin, settings: Settings) -> object | None:
    """The plugin's options: those the settings carry (the CLI's flags), else read from the environment."""
    options_type = plugin.options_type
    if options_type is None:
        return None
    if settings.plugin_options is None:
        return options_from_environment(options_type)
    if not isinstance(settings.plugin_options, options_type):
        raise ValueError(f"the settings carry {type(settings.plugin_options).__name__} options, but the plugin "
                         f"{plugin.plugin_id!r} takes {options_type.__name__}")
    return settings.plugin_options


def options_from_environment(options_type: type) -> object:
    """A plugin's options: the defaults, with the values the environment sets (``DUPLEX_FIELD_NAME``)."""
    options = options_type()
    read_environment(options, os.environ)
    return options


async def start_backend(settings: Settings) -> DuplexBackend:
    backend = build_backend(settings)
    await backend.start()  # a remote backend learns the model's capabilities here
    return backend
