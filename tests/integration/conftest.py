from __future__ import annotations

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from duplex_agent.webrtc.direct.host_address import interface_ipv4


class Microphone:
    """A next_frame source for a client peer: plays what is queued, else silence."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, np.float32)

    def say(self, audio48k: np.ndarray) -> None:
        self._pending = np.concatenate([self._pending, audio48k.astype(np.float32)])

    @property
    def busy(self) -> bool:
        return self._pending.size > 0

    def next_frame(self) -> np.ndarray:
        chunk, self._pending = self._pending[:960], self._pending[960:]
        frame = np.zeros(960, np.int16)
        frame[: chunk.size] = (np.clip(chunk, -1, 1) * 32767).astype(np.int16)
        return frame


@pytest.fixture
async def reference_worker():
    """The embedded worker (reference model) on loopback: (http client, backend, plugin, ice address)."""
    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    address = interface_ipv4()
    app = build_app(backend, Settings(ice_address=address))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    yield client, backend, plugin, address
    await client.close()
    await backend.close()
