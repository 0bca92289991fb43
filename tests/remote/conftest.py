"""Fixtures shared by the remote backend's tests."""

from __future__ import annotations

import pytest

from tests.remote.fake_server import FakeServer


@pytest.fixture
async def fake_servers():
    """Starts a ``FakeServer`` per handler it is given; all are closed after the test."""
    made: list[FakeServer] = []

    async def make(handler) -> FakeServer:
        made.append(await FakeServer(handler).start())
        return made[-1]

    yield make
    for server in made:
        await server.close()
