"""Builds the backend the settings ask for: an in-process plugin, a remote vLLM-Omni server, or a pool of them."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from duplex_agent.agent.app.settings import Settings, read_environment
from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.ports import AdmissionError, DuplexBackend
from duplex_agent.plugins.contract import DuplexModelPlugin

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
        urls = backend_urls(settings.backend)
        backends = BackendList(settings.backend)
        several = backends.file is not None or len(urls) > 1
        # In a pool a host that refuses or never answers is gone at once: the call moves to another.
        # A quiet socket is pinged early (a sixth of the unresponsive timeout): the rest is the pause forgiven.
        options = RemoteOptions(stall_timeout_s=settings.backend_stall_timeout,
                                connect_timeout_s=settings.backend_connect_timeout,
                                unresponsive_after_s=settings.backend_unresponsive_timeout,
                                probe_after_s=settings.backend_unresponsive_timeout / 6,
                                resume_gives_up_unreachable=several,
                                tools=_yes_no("--backend-tools", settings.backend_tools),
                                replies_to_tool_output=_yes_no("--backend-replies-to-tool-output",
                                                               settings.backend_replies_to_tool_output))

        def remote(url: str) -> RemoteBackend:
            return RemoteBackend(url, model=settings.backend_model, api_key=settings.backend_api_key,
                                 max_sessions=settings.max_sessions, session=session, options=options)

        if not several:
            return remote(urls[0])
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


def _yes_no(flag: str, value: str) -> bool | None:
    """A yes/no setting; empty is None (the server's word stands)."""
    words = {"": None, "yes": True, "no": False}
    if value.strip().lower() not in words:
        raise ModelStartError(f"{flag} {value!r}: say yes or no (or nothing, for what the server says)")
    return words[value.strip().lower()]


def backend_urls(spec: str) -> list[str]:
    """The URLs ``--backend`` names now; ModelStartError, in one line, when it names none, its file
    cannot be read, or one of them is no ws:// or wss:// URL."""
    from duplex_agent.agent.remote.pool import BackendList

    backends = BackendList(spec)
    try:
        urls = backends.urls()
    except OSError as exc:
        raise ModelStartError(f"--backend {backends.spec!r}: cannot read the list of backends: "
                              f"{exc.strerror or exc}") from None
    if not urls:
        where = "the file holds no URL" if backends.file is not None else "no URL between the commas"
        raise ModelStartError(f"--backend {backends.spec!r} names no backend ({where})")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ModelStartError(f"--backend: {url!r} is not a ws:// or wss:// URL "
                                  "(ws://HOST:PORT/v1/realtime?duplex=1)")
    return urls


def plugin_options(plugin: DuplexModelPlugin, settings: Settings) -> DataclassInstance | None:
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


def options_from_environment(options_type: type[DataclassInstance]) -> DataclassInstance:
    """A plugin's options: the defaults, with the values the environment sets (``DUPLEX_FIELD_NAME``)."""
    options = options_type()
    read_environment(options, os.environ)
    return options


async def start_backend(settings: Settings) -> DuplexBackend:
    """The backend, started; ModelStartError when no remote backend answers.

    A remote backend's start learns the model (rates, input mode, limits) from a probe session,
    so a worker none answers at start could take no call: it stops with the reason, and a
    supervisor's restart is what waits for the host. In a pool the hosts that do answer are
    enough; the others are logged and started later.
    """
    backend = build_backend(settings)
    try:
        await backend.start()
    except AdmissionError as exc:  # refused, unreachable, unauthorized or full (remote only)
        from duplex_agent.agent.remote.pool import BackendPool

        if isinstance(backend, BackendPool):
            raise ModelStartError(f"--backend: none of the {len(backend.urls)} backends answered; the first: "
                                  f"{exc}") from None
        raise ModelStartError(f"--backend: {exc}") from None
    return backend
