"""The ports' optional members: an implementation without one still works, with the default."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from duplex_agent.agent.app import bootstrap
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import Conversation, DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.plugins.contract.engine import DuplexEngine
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

CAPS = DuplexCapabilities(plugin_id="t", input_sample_rate=16000, unit_samples=1280, output_sample_rate=24000,
                          max_sessions=2)


class BareBackend(DuplexBackend):
    """Only the required members."""

    capabilities = CAPS
    active_sessions = 1

    async def open(self) -> Conversation:
        raise NotImplementedError

    def stop_admitting(self) -> None: ...

    async def close(self) -> None: ...


class BareConversation(Conversation):
    session_id = "bare"
    capabilities = CAPS

    def send(self, event) -> None: ...  # noqa: ANN001

    async def events(self) -> AsyncIterator:
        return
        yield

    async def close(self, reason: str = "client_closed") -> None: ...


class BareEngine(DuplexEngine):
    stage_count = 1

    async def submit(self, plan) -> None: ...  # noqa: ANN001

    def outputs(self, request_id):  # noqa: ANN001, ANN201
        raise NotImplementedError

    async def abort(self, request_ids) -> None: ...  # noqa: ANN001


async def test_a_backend_without_start_starts_and_cannot_tell_its_servers_free_sessions(monkeypatch):
    backend = BareBackend()
    assert backend.server_free_sessions is None
    monkeypatch.setattr(bootstrap, "build_backend", lambda settings: backend)
    assert await bootstrap.start_backend(Settings()) is backend  # the default start does nothing, and returns


async def test_start_backend_starts_a_backend_that_has_start(monkeypatch):
    started = asyncio.Event()

    class Starting(BareBackend):
        async def start(self) -> None:
            started.set()

    monkeypatch.setattr(bootstrap, "build_backend", lambda settings: Starting())
    await bootstrap.start_backend(Settings())
    assert started.is_set()


def test_worker_load_without_server_figures_counts_the_local_slots():
    worker = pytest.importorskip("duplex_agent.agent.app.livekit_worker")

    class Remote(BareBackend):
        @property
        def server_free_sessions(self) -> int | None:
            return 1

    assert worker.worker_load(BareBackend(), worker.LiveCalls(), 4) == pytest.approx(0.25)  # 1 of 4 in use
    assert worker.worker_load(Remote(), worker.LiveCalls(), 4) == pytest.approx(0.75)  # the servers have 1 free


def test_a_conversation_without_use_caller_vad_keeps_its_own_turn_detection():
    conversation = BareConversation()
    assert conversation.use_caller_vad(object()) is None  # type: ignore[arg-type]


def test_an_engine_without_a_frame_clock_has_no_overrun_callback_and_takes_one():
    engine = BareEngine()
    assert engine.on_overrun is None
    engine.on_overrun = lambda lag_ms: None  # what bootstrap does for every engine
    assert BareEngine().on_overrun is None  # set on the instance only


async def test_local_backend_close_closes_a_runner_in_its_own_loop():
    """A LiveKit job's runner lives in the job's loop; the worker closes the backend from its main loop."""
    plugin = ScriptedPlugin(as_float32_audio, Script())
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="job-loop", daemon=True)
    thread.start()
    try:
        runner = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(backend.open(), loop))
        here = await backend.open()
        assert backend.active_sessions == 2
        await asyncio.wait_for(backend.close(), 60)
        assert runner.closed_reason == "shutdown" and here.closed_reason == "shutdown"
        assert backend.active_sessions == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
