"""With a key: every protected route refuses missing, wrong and expired credentials with 401
and a reason before any session work; the key and a fresh token work over the websocket
and over aiortc; origins are checked; metrics can move to their own port."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from duplex_agent.agent.app.access.credentials import AccessKeys
from tests.security.conftest import new_key, sessions_total
from tests.support.audio import tone
from tests.webrtc.client_peer import ClientPeer

REALTIME = "/v1/realtime?duplex=1"
SDP = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
#: (method, path, body): every route a key protects.
PROTECTED = [
    ("GET", "/metrics", None),
    ("GET", "/healthz", None),
    ("POST", "/api/token", {}),
    ("POST", "/api/offer", {"sdp": SDP, "type": "offer"}),
    ("PATCH", "/api/offer", {"pc_id": "x", "candidates": []}),
    ("POST", "/api/livekit/token", {"room": "r", "identity": "i"}),
]


class Authorised:
    """A test client that sends a bearer credential with each POST (what ClientPeer.connect uses)."""

    def __init__(self, http: TestClient, credential: str) -> None:
        self.http = http
        self.credential = credential

    def post(self, path: str, **kwargs):
        return self.http.post(path, headers={"Authorization": f"Bearer {self.credential}"}, **kwargs)


def session_tasks() -> int:
    """Tasks other than aiohttp's connection handlers: a session starts some, a refusal none."""
    return sum(not t.get_coro().__qualname__.startswith("RequestHandler.") for t in asyncio.all_tasks())


def expired_token(key: str) -> str:
    minted_an_hour_ago = AccessKeys(key, clock=lambda: __import__("time").time() - 3600)
    return minted_an_hour_ago.mint(60)[0]


def bad_credentials(key: str) -> dict[str, dict[str, str]]:
    return {
        "no credentials": {},
        "a wrong key": {"Authorization": f"Bearer {new_key()}"},
        "a token signed with another key": {"Authorization": f"Bearer {AccessKeys(new_key()).mint()[0]}"},
        "an expired token": {"Authorization": f"Bearer {expired_token(key)}"},
        "not a bearer header": {"Authorization": f"Basic {key}"},
    }


async def _websocket_status(worker, **kwargs) -> int:
    try:
        ws = await worker.http.ws_connect(REALTIME, **kwargs)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    return 101


async def _session_created(ws: aiohttp.ClientWebSocketResponse) -> dict:
    await ws.send_str(json.dumps({"type": "session.update", "session": {}}))
    async with asyncio.timeout(10):
        while True:
            event = json.loads((await ws.receive()).data)
            if event["type"] == "session.created":
                return event


async def test_every_protected_route_refuses_bad_credentials_before_any_work(guarded_worker, api_key, caplog):
    caplog.set_level(logging.DEBUG)
    worker = await guarded_worker()
    before = sessions_total()
    tasks_before = session_tasks()
    for what, headers in bad_credentials(api_key).items():
        for method, path, body in PROTECTED:
            response = await worker.http.request(method, path, json=body, headers=headers)
            answer = await response.json()
            assert response.status == 401, (what, path, answer)
            assert answer["error"]["code"] == "unauthorized" and answer["error"]["message"], (what, path)
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert await _websocket_status(worker, headers=headers) == 401, what
        if headers.get("Authorization", "").startswith("Bearer "):
            value = headers["Authorization"].partition(" ")[2]
            assert await _websocket_status(worker, protocols=("realtime", f"openai-insecure-api-key.{value}")) == 401
    assert worker.work_done() == (0, 0)
    assert sessions_total() == before
    assert session_tasks() == tasks_before
    assert api_key not in caplog.text


async def test_the_reason_names_what_was_wrong(guarded_worker, api_key):
    worker = await guarded_worker()
    reasons = {}
    for what, headers in bad_credentials(api_key).items():
        response = await worker.http.post("/api/offer", json={}, headers=headers)
        reasons[what] = (await response.json())["error"]["message"]
    assert "needs credentials" in reasons["no credentials"]
    assert reasons["a wrong key"] == "wrong API key"
    assert "signature" in reasons["a token signed with another key"]
    assert "expired" in reasons["an expired token"]
    assert "Bearer" in reasons["not a bearer header"]


async def test_a_token_opens_sessions_but_cannot_mint_tokens_or_read_metrics(guarded_worker, api_key):
    worker = await guarded_worker()
    response = await worker.http.post("/api/token", json={"ttl_s": 30}, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status == 200, await response.text()
    token = (await response.json())["token"]
    for path in ("/api/token", "/metrics", "/healthz"):
        response = await worker.http.request("POST" if path == "/api/token" else "GET", path,
                                             headers={"Authorization": f"Bearer {token}"})
        assert response.status == 401, path
        assert "needs the API key" in (await response.json())["error"]["message"]
    assert (await worker.http.get("/metrics", headers={"Authorization": f"Bearer {api_key}"})).status == 200
    too_long = await worker.http.post("/api/token", json={"ttl_s": 10**9}, headers={"Authorization": f"Bearer {api_key}"})
    assert too_long.status == 400 and (await too_long.json())["error"]["code"] == "invalid_ttl"


@pytest.mark.parametrize("how", ["key in header", "token in header", "key as subprotocol", "token as subprotocol"])
async def test_the_key_and_a_fresh_token_open_a_websocket_session(guarded_worker, api_key, how, caplog):
    caplog.set_level(logging.DEBUG)
    worker = await guarded_worker()
    credential = api_key if how.startswith("key") else worker.guard.keys.mint()[0]
    if how.endswith("header"):
        ws = await worker.http.ws_connect(REALTIME, headers={"Authorization": f"Bearer {credential}"})
    else:
        ws = await worker.http.ws_connect(REALTIME, protocols=("realtime", f"openai-insecure-api-key.{credential}"))
        assert ws.protocol == "realtime"  # browsers fail a handshake that gets no subprotocol back
    try:
        created = await _session_created(ws)
        assert created["session"]
        assert worker.work_done() == (1, 1)
    finally:
        await ws.close()
    assert api_key not in caplog.text and credential not in caplog.text


async def test_a_lone_credential_subprotocol_is_echoed(guarded_worker, api_key):
    worker = await guarded_worker()
    token = worker.guard.keys.mint()[0]
    ws = await worker.http.ws_connect(REALTIME, protocols=(f"openai-insecure-api-key.{token}",))
    try:
        assert ws.protocol == f"openai-insecure-api-key.{token}"
        await _session_created(ws)
    finally:
        await ws.close()


@pytest.mark.parametrize("credential", ["key", "token"])
async def test_the_key_and_a_fresh_token_signal_an_aiortc_peer(guarded_worker, api_key, host_address, credential):
    worker = await guarded_worker()
    authorised = Authorised(worker.http, api_key if credential == "key" else worker.guard.keys.mint()[0])
    peer = ClientPeer(host_address, lambda: (tone(20, rate=48000) * 32767).astype("int16"))
    try:
        await peer.connect(authorised)
        async with asyncio.timeout(20):
            while "session.created" not in peer.message_types():
                await asyncio.sleep(0.05)
        assert worker.work_done() == (1, 1)
        refused = ClientPeer(host_address, lambda: (tone(20, rate=48000) * 32767).astype("int16"))
        with pytest.raises(AssertionError, match="unauthorized"):
            await refused.connect(worker.http)  # the same worker, no credentials
        await refused.close()
        assert worker.work_done() == (1, 1)
    finally:
        await peer.close()


async def test_origins_other_than_the_page_s_own_are_refused(guarded_worker, monkeypatch):
    monkeypatch.setenv("DUPLEX_ALLOWED_ORIGINS", "https://app.example")
    worker = await guarded_worker()
    own = f"http://{worker.http.host}:{worker.http.port}"
    assert await _websocket_status(worker, headers={"Origin": "http://evil.example"}) == 403
    assert await _websocket_status(worker, headers={"Origin": f"http://{worker.http.host}:1"}) == 403
    refused = await worker.http.post("/api/offer", data="{}", headers={"Origin": "http://evil.example",
                                                                      "Content-Type": "text/plain"})
    assert refused.status == 403 and (await refused.json())["error"]["code"] == "origin_not_allowed"
    assert worker.work_done() == (0, 0)
    for origin in (own, "https://app.example"):
        ws = await worker.http.ws_connect(REALTIME, headers={"Origin": origin})
        await _session_created(ws)
        await ws.close()
    assert len(worker.opened) == 2


async def test_signaling_bodies_stay_bounded(guarded_worker, api_key):
    worker = await guarded_worker()
    big = "x" * (70 * 1024)
    unauthenticated = await worker.http.post("/api/offer", data=big)
    assert unauthenticated.status == 401  # refused before the body is read
    response = await worker.http.post("/api/offer", data=big, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status == 413
    assert worker.work_done() == (0, 0)


async def test_metrics_on_their_own_port(guarded_worker, api_key, free_port):
    worker = await guarded_worker(metrics_port=free_port)
    from aiohttp import web

    site = web.TCPSite(worker.http.server.runner, "127.0.0.1", free_port)
    await site.start()
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/healthz"):
            async with session.get(f"http://127.0.0.1:{free_port}{path}") as response:
                assert response.status == 200, path  # no key on the metrics port
            main = await worker.http.get(path, headers={"Authorization": f"Bearer {api_key}"})
            assert main.status == 404, path
        async with session.get(f"http://127.0.0.1:{free_port}/") as response:
            assert response.status == 404  # only metrics there
    assert (await worker.http.get("/")).status == 200


async def test_without_a_key_everything_stays_open(guarded_worker, monkeypatch):
    monkeypatch.delenv("DUPLEX_API_KEY", raising=False)
    worker = await guarded_worker()
    assert (await worker.http.get("/metrics")).status == 200
    assert (await (await worker.http.get("/api/access")).json()) == {"key_required": False}
    ws = await worker.http.ws_connect(REALTIME, protocols=("realtime", "openai-insecure-api-key.anything"))
    await _session_created(ws)
    await ws.close()
    assert (await worker.http.post("/api/token")).status == 404
