"""A worker with access control in front of it: the real app, the scripted model, real sockets.

Secrets reach the worker the way an operator gives them: through the environment
(``Settings.from_env``), never as arguments. Every key is random per test, so no test
file holds one.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

import pytest
from aiohttp.test_utils import TestClient, TestServer

from duplex_agent.agent import metrics
from duplex_agent.agent.app.access.guard import ACCESS_GUARD, AccessGuard
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.direct.host_address import interface_ipv4


def new_key() -> str:
    return "dk-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def host_address() -> str:
    try:
        return interface_ipv4()
    except ValueError:
        pytest.skip("no non-loopback IPv4 interface")


@pytest.fixture
def api_key(monkeypatch) -> str:
    key = new_key()
    monkeypatch.setenv("DUPLEX_API_KEY", key)
    return key


def sessions_total() -> float:
    return sum(s.value for family in metrics.SESSIONS_TOTAL.collect() for s in family.samples
               if s.name.endswith("_total"))


@dataclass
class GuardedWorker:
    http: TestClient
    backend: LocalBackend
    guard: AccessGuard
    opened: list[int] = field(default_factory=list)

    def url(self, path: str, scheme: str = "http") -> str:
        return str(self.http.make_url(path)).replace("http", scheme, 1)

    def work_done(self) -> tuple[int, int]:
        """(backend.open calls, live backend sessions): what a refused request must leave at zero."""
        return len(self.opened), self.backend.active_sessions


@pytest.fixture
async def guarded_worker(host_address):
    """guarded_worker(**environment) -> a GuardedWorker whose settings come from DUPLEX_* variables."""
    made: list[GuardedWorker] = []

    async def make(host: str = "127.0.0.1", max_sessions: int = 8, **env: str) -> GuardedWorker:
        environ = {f"DUPLEX_{k.upper()}": str(v) for k, v in env.items()}
        settings = Settings.from_env({**os.environ, **environ})
        settings.ice_address = host_address
        settings.max_sessions = max_sessions
        plugin = ScriptedPlugin(as_float32_audio, Script(reply="fine thanks"))
        backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=max_sessions)
        worker = GuardedWorker(None, backend, None)  # type: ignore[arg-type]
        real_open = backend.open

        async def counting_open():
            worker.opened.append(1)
            return await real_open()

        backend.open = counting_open  # type: ignore[method-assign]
        app = build_app(backend, settings)
        worker.guard = app[ACCESS_GUARD]
        worker.http = TestClient(TestServer(app, host=host))
        await worker.http.start_server()
        made.append(worker)
        return worker

    yield make
    for worker in made:
        await worker.http.close()
        await worker.backend.close()
