"""Per-address limits on real sockets: a flood from one address gets 429 with Retry-After,
another address keeps being served, the limiter's memory stays flat, and open-session
slots come back when sessions end (websocket and aiortc)."""

from __future__ import annotations

import asyncio
import json
import logging
import resource

import aiohttp
import pytest

from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from tests.security.test_access_routes import REALTIME, _session_created
from tests.support.audio import tone
from tests.webrtc.client_peer import ClientPeer


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


async def _handshake(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
    try:
        ws = await session.ws_connect(url)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status, exc.headers.get("Retry-After") if exc.headers else None
    await ws.close()
    return 101, None


async def _serve_one(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        return await _session_created(ws)


async def test_a_flood_from_one_address_is_refused_while_others_are_served(guarded_worker, host_address, caplog):
    caplog.set_level(logging.WARNING)  # pytest keeps every captured record in memory: keep it out of the figure
    worker = await guarded_worker(host="0.0.0.0", sessions_per_minute=20, sessions_per_address=3)
    port = worker.http.port
    flood_url = f"http://127.0.0.1:{port}{REALTIME}"
    other_url = f"http://{host_address}:{port}{REALTIME}"
    limits = worker.guard.limits

    async def flood(count: int) -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession() as session:
            return [await _handshake(session, flood_url) for _ in range(count)]

    first = await flood(200)
    statuses = [status for status, _ in first]
    assert statuses[:20] == [101] * 20 and set(statuses[20:]) == {429}, statuses
    assert all(1 <= int(retry) <= 60 for status, retry in first if status == 429)
    await _serve_one(other_url)  # the other address's first session warms its own caches
    baseline = rss_mib()
    for _ in range(3):
        flooded, served = await asyncio.gather(flood(1000), _serve_one(other_url))
        assert {status for status, _ in flooded} == {429}
        assert served["type"] == "session.created"  # the other address is served during the flood
    growth = rss_mib() - baseline
    print(f"RSS growth over 3000 refused handshakes: {growth:.1f} MiB")
    assert growth < 8, f"memory grew {growth:.1f} MiB over 3000 refused handshakes"
    assert len(limits._starts["127.0.0.1"]) <= 20  # one address's record is bounded by its rate
    assert limits.tracked_addresses() <= 2
    assert len(worker.opened) == 4  # the other client's sessions; the flood never got past a handshake


async def test_open_sessions_per_address_come_back_when_sessions_end(guarded_worker):
    worker = await guarded_worker(sessions_per_address=2)
    first = await worker.http.ws_connect(REALTIME)
    second = await worker.http.ws_connect(REALTIME)
    await _session_created(first)
    await _session_created(second)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await worker.http.ws_connect(REALTIME)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "10"
    await first.close()
    async with asyncio.timeout(10):
        while worker.guard.limits.open_count("127.0.0.1") > 1:
            await asyncio.sleep(0.02)
    third = await worker.http.ws_connect(REALTIME)
    await _session_created(third)
    await third.close()
    await second.close()


async def test_a_webrtc_peer_holds_its_slot_until_it_leaves(guarded_worker, host_address):
    worker = await guarded_worker(sessions_per_address=1)
    silence = lambda: (tone(20, level=0.0, rate=48000) * 32767).astype("int16")  # noqa: E731
    peer = ClientPeer(host_address, silence)
    await peer.connect(worker.http)
    async with asyncio.timeout(20):  # connected: its close reaches the worker (SCTP abort)
        while "session.created" not in peer.message_types():
            await asyncio.sleep(0.05)
    second = ClientPeer(host_address, silence)
    try:
        response = await worker.http.post("/api/offer", json={"sdp": "v=0", "type": "offer"})
        assert response.status == 429 and "close one first" in (await response.json())["error"]["message"]
        assert response.headers["Retry-After"] == "10"
        await peer.close()
        registry = worker.http.app[WEBRTC_PEERS]
        async with asyncio.timeout(15):
            while registry.sessions:
                await asyncio.sleep(0.05)
        await second.connect(worker.http)
        assert len(worker.opened) == 2
    finally:
        await second.close()


async def test_a_refused_offer_gives_its_slot_back(guarded_worker):
    worker = await guarded_worker(sessions_per_address=1)
    for _ in range(3):
        bad = await worker.http.post("/api/offer", json={"sdp": "not sdp", "type": "offer"})
        assert bad.status == 400, await bad.text()
    assert worker.guard.limits.open_count("127.0.0.1") == 0
    assert json.loads(await bad.text())["error"]["code"] == "malformed_sdp"
