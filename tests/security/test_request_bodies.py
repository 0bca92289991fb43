"""Every route that takes a body reads all of it, however TCP cuts it up, and refuses
a body past its cap with 413 and a reason.

The requests go over raw sockets to the real app's aiohttp server: the headers and
the body are written in parts, and each next part waits until the server has taken
in the one before it (the request stream's byte count), so the handler has really
run with only part of its body there.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiortc import RTCConfiguration, RTCPeerConnection

from duplex_agent.agent.app.access.guard import MAX_TOKEN_BODY_BYTES
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.signaling import MAX_BODY_BYTES as SIGNALING_MAX_BODY_BYTES
from duplex_agent.webrtc.livekit.tokens import MAX_BODY_BYTES as LIVEKIT_MAX_BODY_BYTES
from tests.security.conftest import new_key

PARTS = 4
DEADLINE_S = 30.0


class BodyWorker:
    """The real app with a key and LiveKit token minting, and a probe on the request stream."""

    def __init__(self, server: TestServer, key: str) -> None:
        self.server = server
        self.key = key
        self.in_flight: web.Request | None = None  # the request whose handler runs now
        self.answered = False  # the handler of the request being sent has returned

    async def request(self, method: str, path: str, body: bytes, *, parts: int = PARTS,
                      chunked: bool = False) -> tuple[int, dict | None]:
        """Send ``body`` in ``parts`` writes, each after the server has taken in the last; (status, JSON body)."""
        self.answered = False
        reader, writer = await asyncio.open_connection(self.server.host, self.server.port)
        try:
            length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
            writer.write((f"{method} {path} HTTP/1.1\r\nHost: {self.server.host}:{self.server.port}\r\n"
                          f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
                          f"{length}\r\nConnection: close\r\n\r\n").encode())
            await writer.drain()
            step = -(-len(body) // parts)
            sent = 0
            for start in range(0, len(body), step):
                part = body[start:start + step]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                await writer.drain()
                sent += len(part)
                if sent < len(body) and not await self._taken_in(sent):
                    break  # the server answered before the whole body was there (a refusal)
            else:
                if chunked:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
            return await asyncio.wait_for(_response(reader), DEADLINE_S)
        finally:
            writer.close()

    async def _taken_in(self, size: int) -> bool:
        """Wait until the handler's request stream holds ``size`` body bytes; False if it answered first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while self.in_flight is None or self.in_flight.content.total_bytes < size:
            if self.answered:
                return False
            assert loop.time() < deadline, f"the server never took in {size} body bytes"
            await asyncio.sleep(0.005)
        return True


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict | None]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
    length = int(headers.get("Content-Length", "0"))
    payload = await reader.readexactly(length) if length else b""
    return status, json.loads(payload) if payload else None


@pytest.fixture
async def worker(host_address):
    key = new_key()
    settings = Settings.from_env({**os.environ, "DUPLEX_API_KEY": key, "LIVEKIT_URL": "ws://127.0.0.1:7880",
                                  "LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": new_key()})
    settings.ice_address = host_address
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="fine thanks"))
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=4)
    app = build_app(backend, settings, mint_livekit_tokens=True)
    server = TestServer(app, host="127.0.0.1")
    made = BodyWorker(server, key)

    @web.middleware
    async def probe(request: web.Request, handler):
        made.in_flight = request
        try:
            return await handler(request)
        finally:
            made.in_flight = None
            made.answered = True

    app.middlewares.insert(0, probe)
    await server.start_server()
    yield made
    await server.close()
    await backend.close()


async def _offer_sdp(host_address: str) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("events")
    with candidates_on(host_address):
        await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def _json(value: dict) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_every_body_route_reads_a_body_sent_in_parts(worker, host_address, chunked):
    pc, sdp = await _offer_sdp(host_address)
    try:
        status, answer = await worker.request("POST", "/api/offer", _json({"sdp": sdp, "type": "offer"}),
                                              chunked=chunked)
        assert status == 200, answer
        assert answer["type"] == "answer" and answer["sdp"].startswith("v=0")
        pc_id = answer["pc_id"]

        status, refused = await worker.request(
            "PATCH", "/api/offer", _json({"pc_id": pc_id, "candidates": [{"candidate": "", "sdp_mid": "0"}]}),
            chunked=chunked)
        assert status == 204, refused

        status, refused = await worker.request("DELETE", "/api/offer", _json({"pc_id": pc_id}), chunked=chunked)
        assert status == 204, refused
        status, refused = await worker.request("DELETE", "/api/offer", _json({"pc_id": pc_id}), chunked=chunked)
        assert (status, refused["error"]["code"]) == (404, "unknown_pc_id")  # the first one did hang up
    finally:
        await pc.close()

    status, minted = await worker.request("POST", "/api/token", _json({"ttl_s": 60}), parts=3, chunked=chunked)
    assert status == 200, minted
    assert minted["ttl_s"] == 60 and minted["token"]

    status, room = await worker.request("POST", "/api/livekit/token", _json({"room": "room-1", "identity": "alice"}),
                                        parts=3, chunked=chunked)
    assert status == 200, room
    assert (room["room"], room["identity"]) == ("room-1", "alice") and room["token"]


@pytest.mark.parametrize(("method", "path", "limit"), [
    ("POST", "/api/offer", SIGNALING_MAX_BODY_BYTES),
    ("PATCH", "/api/offer", SIGNALING_MAX_BODY_BYTES),
    ("DELETE", "/api/offer", SIGNALING_MAX_BODY_BYTES),
    ("POST", "/api/token", MAX_TOKEN_BODY_BYTES),
    ("POST", "/api/livekit/token", LIVEKIT_MAX_BODY_BYTES),
])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_past_the_cap_is_refused_with_413(worker, method, path, limit, chunked):
    body = b'{"pad": "' + b"x" * limit + b'"}'
    status, refused = await worker.request(method, path, body, parts=2, chunked=chunked)
    assert status == 413
    assert refused["error"]["code"] == "body_too_large"
    assert str(limit) in refused["error"]["message"]


async def test_a_body_at_the_cap_is_read(worker):
    """The cap is inclusive: a body of exactly the limit is parsed (here it is simply the wrong JSON)."""
    body = b'{"ttl_s": 60' + b" " * (MAX_TOKEN_BODY_BYTES - 13) + b"}"
    assert len(body) == MAX_TOKEN_BODY_BYTES
    status, minted = await worker.request("POST", "/api/token", body, parts=3)
    assert status == 200, minted
