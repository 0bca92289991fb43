from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.runtime.drivers import Driver, RunnerDriver, WebSocketDriver


@pytest.fixture
async def open_driver(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Any]]:
    """open_driver(script, transport=..., plugin=..., **backend_kwargs) -> (driver, plugin, backend)."""
    cleanups: list[Any] = []

    async def factory(script: Script | None = None, *, transport: str = "runner", limits: SessionLimits | None = None,
                      max_sessions: int = 4, engine: Any = None, config_timeout_s: float = 10.0,
                      plugin: ScriptedPlugin | None = None, cpu_guard: CpuGuard | None = None):
        plugin = plugin or ScriptedPlugin(as_float32_audio, script or Script())
        backend = LocalBackend(plugin, engine or plugin.build_local_engine(), max_sessions=max_sessions, limits=limits)
        cleanups.append(backend.close)
        if transport == "runner":
            driver: Driver = await RunnerDriver.open(backend)
        else:
            app = build_app(backend, Settings(), with_webrtc=False, config_timeout_s=config_timeout_s,
                            cpu_guard=cpu_guard)
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            cleanups.append(server.close)
            driver = await WebSocketDriver.open(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
            driver.server = server  # type: ignore[attr-defined]
            driver.backend = backend  # type: ignore[attr-defined]
        cleanups.append(driver.close)
        return driver, plugin, backend

    yield factory
    for cleanup in reversed(cleanups):
        with contextlib.suppress(Exception):
            await cleanup()


TRANSPORTS = pytest.mark.parametrize("transport", ["runner", "websocket"])
