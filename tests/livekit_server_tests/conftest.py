from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from livekit import rtc

from devtools.livekit_server import LoopbackLiveKitServer

# At exit, dispose livekit's FFI and wait out its callbacks before the interpreter finalizes.
from duplex_agent.webrtc.livekit import ffi_router  # noqa: F401


@pytest_asyncio.fixture
async def server() -> AsyncIterator[LoopbackLiveKitServer]:
    srv = LoopbackLiveKitServer(api_key="devkey", api_secret="secret")
    await srv.start()
    try:
        yield srv
    finally:
        await asyncio.wait_for(srv.stop(), 20)


@pytest_asyncio.fixture
async def rooms() -> AsyncIterator[list[rtc.Room]]:
    created: list[rtc.Room] = []
    yield created
    # Every room leaves, on this loop; one that cannot is a failure, not a room left connected.
    results = await asyncio.gather(*(asyncio.wait_for(r.disconnect(), 20) for r in created),
                                   return_exceptions=True)
    failed = [(r.local_participant.identity, e) for r, e in zip(created, results) if isinstance(e, BaseException)]
    assert not failed, f"rooms that did not disconnect: {failed}"
