from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.realtime_ws import RealtimeEndpoint
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.conformance.omni_client import OmniClient


@pytest.fixture
async def our_server() -> AsyncIterator[Callable[..., Any]]:
    """our_server(script, resume_grace_s=30, journal_bytes=None) -> (url, OmniClient factory, plugin, backend).

    The worker's own app (``build_app``) with the scripted model; ``journal_bytes`` swaps in an
    endpoint with that replay bound.
    """
    cleanups: list[Any] = []

    async def factory(script: Script | None = None, *, resume_grace_s: float = 30.0, journal_bytes: int | None = None):
        plugin = ScriptedPlugin(as_float32_audio, script or Script())
        backend = LocalBackend(plugin, plugin.build_local_engine())
        cleanups.append(backend.close)
        if journal_bytes is None:
            app = build_app(backend, Settings(resume_grace_s=resume_grace_s), with_webrtc=False)
        else:
            app = web.Application()
            RealtimeEndpoint(backend, resume_grace_s=resume_grace_s, journal_bytes=journal_bytes).register(app)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        cleanups.append(server.close)
        url = str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)

        def client() -> OmniClient:
            made = OmniClient(url)
            cleanups.append(made.close)
            return made

        return url, client, plugin, backend

    yield factory
    for cleanup in reversed(cleanups):
        with contextlib.suppress(Exception):
            await cleanup()
