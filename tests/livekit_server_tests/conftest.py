from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest_asyncio
from livekit import rtc

from devtools.livekit_server import LoopbackLiveKitServer


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
    for r in created:
        try:
            await asyncio.wait_for(r.disconnect(), 10)
        except Exception:
            pass
