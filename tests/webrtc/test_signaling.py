
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duplex_agent.agent.metrics import SESSIONS_REFUSED
from duplex_agent.agent.session.cpu_guard import RETRY_AFTER_S, CpuGuard
from duplex_agent.agent.session.ports import AdmissionError
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.signaling import (
    FULL_RETRY_AFTER_S,
    MAX_BODY_BYTES,
    WEBRTC_PEERS,
    register_webrtc_routes,
)
from tests.support.audio import tone
from tests.support.cpu import ScriptedCpu
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend, EnergyVadModel

pytestmark = pytest.mark.asyncio

VIDEO_ONLY_SDP = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
    "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:96 VP8/90000\r\n"
)


@pytest.fixture
async def server(host_address):
    backend = EchoBackend(max_sessions=2)
    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address, vad_model=EnergyVadModel())
    async with TestClient(TestServer(app)) as http:
        yield http, backend, app


async def error_of(response) -> tuple[int, str]:
    body = await response.json()
    assert body["error"]["message"]
    return response.status, body["error"]["code"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"type": "offer"}', 400, "missing_field"),
        (b'{"sdp": 42, "type": "offer"}', 400, "invalid_field"),
        (b'{"sdp": "v=0", "type": "answer"}', 400, "invalid_field"),
        (b'{"sdp": "hello", "type": "offer"}', 400, "malformed_sdp"),
        (b'{"sdp": "v=0\\r\\n", "type": "offer"}', 400, "malformed_sdp"),
        (b'{"sdp": "v=0", "type": "offer", "pc_id": 7}', 400, "invalid_field"),
        (b'{"sdp": "v=0\\r\\nm=audio 9 RTP/AVP 0\\r\\n", "type": "offer", "pc_id": "nope"}', 404, "unknown_pc_id"),
    ],
)
async def test_bad_offers_get_a_4xx_with_a_reason(server, body, status, code):
    http, backend, _ = server
    response = await http.post("/api/offer", data=body)
    assert await error_of(response) == (status, code)
    assert backend.conversations == []


async def test_offer_without_audio_is_refused(server):
    http, _, _ = server
    response = await http.post("/api/offer", json={"sdp": VIDEO_ONLY_SDP, "type": "offer"})
    assert await error_of(response) == (400, "no_audio")


async def test_oversize_body_is_refused(server):
    http, _, _ = server
    response = await http.post("/api/offer", data=b"x" * (MAX_BODY_BYTES + 1))
    assert await error_of(response) == (413, "body_too_large")

    async def chunked():  # no Content-Length: the cap still holds
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b"y" * 4096

    response = await http.post("/api/offer", data=chunked())
    assert await error_of(response) == (413, "body_too_large")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"pc_id": "nope", "candidates": []}, 404, "unknown_pc_id"),
        ({"candidates": []}, 400, "missing_field"),
        ({"pc_id": "nope", "candidates": "x"}, 400, "invalid_field"),
    ],
)
async def test_bad_candidate_patches_get_a_4xx(server, body, status, code):
    http, _, _ = server
    assert await error_of(await http.patch("/api/offer", json=body)) == (status, code)


async def test_server_still_answers_a_good_offer_after_bad_ones(server, host_address):
    http, backend, app = server
    for body in (b"{", b'{"sdp": "nope", "type": "offer"}', b"z" * (MAX_BODY_BYTES + 10)):
        assert (await http.post("/api/offer", data=body)).status >= 400
    client = ClientPeer(host_address, frames_of(tone(5000, rate=48000)))
    try:
        await client.connect(http)
        assert client.pc_id in app[WEBRTC_PEERS].sessions
        bad_candidate = {"pc_id": client.pc_id, "candidates": [{"candidate": "garbage", "sdp_mid": "0"}]}
        assert await error_of(await http.patch("/api/offer", json=bad_candidate)) == (400, "invalid_candidate")
        end = {"pc_id": client.pc_id, "candidates": [{"candidate": "", "sdp_mid": "0", "sdp_mline_index": 0}]}
        assert (await http.patch("/api/offer", json=end)).status == 204
        await until(lambda: client.pc.connectionState == "connected", 10, "the peer to connect")
    finally:
        await client.close()
    await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
    assert backend.conversations[0].closed_reason is not None


async def test_full_backend_gives_503_with_its_code(server, host_address, monkeypatch):
    http, backend, _ = server

    async def refuse():
        raise AdmissionError("no room", code="resource_exhausted")

    monkeypatch.setattr(backend, "open", refuse)
    client = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    try:
        with pytest.raises(AssertionError, match="resource_exhausted"):
            await client.connect(http)
    finally:
        await client.close()


async def test_shutdown_closes_every_peer(host_address):
    backend = EchoBackend()
    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address, vad_model=EnergyVadModel())
    http = TestClient(TestServer(app))
    await http.start_server()
    client = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    try:
        await client.connect(http)
        assert app[WEBRTC_PEERS].sessions
    finally:
        await http.close()  # runs on_shutdown
        await client.close()
    assert not app[WEBRTC_PEERS].sessions
    assert backend.conversations[0].closed_reason == "shutdown"


async def test_a_full_worker_says_when_to_ask_again(server, host_address):
    http, backend, _ = server
    backend.max_sessions = 0
    client = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    try:
        with candidates_on(host_address):
            await client.pc.setLocalDescription(await client.pc.createOffer())
        response = await http.post("/api/offer", json={"sdp": client.pc.localDescription.sdp, "type": "offer"})
        assert await error_of(response) == (503, "resource_exhausted")
        assert response.headers["Retry-After"] == str(FULL_RETRY_AFTER_S)
    finally:
        await client.close()


async def test_a_saturated_machine_refuses_new_calls_and_keeps_the_live_one(host_address):
    cpu = ScriptedCpu()
    guard = CpuGuard(0.9, cpu.meter())
    backend = EchoBackend(max_sessions=4)
    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address, vad_model=EnergyVadModel(), cpu_guard=guard)
    live = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    late = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    async with TestClient(TestServer(app)) as http:
        try:
            cpu.run(guard.meter, 6.0, 0.4)
            await live.connect(http)
            await until(lambda: live.pc.connectionState == "connected", 10, "the first call to connect")

            cpu.run(guard.meter, 6.0, 0.98)
            with candidates_on(host_address):
                await late.pc.setLocalDescription(await late.pc.createOffer())
            offer = {"sdp": late.pc.localDescription.sdp, "type": "offer"}
            refusals = SESSIONS_REFUSED.labels("webrtc", "overloaded")._value.get()
            response = await http.post("/api/offer", json=offer)
            assert await error_of(response) == (503, "overloaded")
            assert SESSIONS_REFUSED.labels("webrtc", "overloaded")._value.get() == refusals + 1
            assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
            assert len(backend.conversations) == 1  # the refused call opened nothing

            heard = len(live.received)
            await until(lambda: len(live.received) > heard + 25, 10, "the live call's echo going on")
            assert live.pc.connectionState == "connected"
            assert backend.conversations[0].closed_reason is None

            cpu.run(guard.meter, 6.0, 0.5)
            response = await http.post("/api/offer", json=offer)
            assert response.status == 200, await response.text()  # the burst passed: admitted
        finally:
            await live.close()
            await late.close()
