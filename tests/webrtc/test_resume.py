"""A resumable direct peer whose connection goes comes back to the same conversation."""

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCSessionDescription

from duplex_agent.agent.protocol.events import SessionUpdate
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS, register_webrtc_routes
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend

pytestmark = pytest.mark.asyncio


async def offer(client: ClientPeer, http: TestClient, **fields) -> tuple[int, dict]:
    """POST an offer with extra fields (``resumable``, ``resume``); completes the connection when answered."""
    with candidates_on(client.host_address):
        await client.pc.setLocalDescription(await client.pc.createOffer())
    response = await http.post("/api/offer", json={"sdp": client.pc.localDescription.sdp, "type": "offer", **fields})
    answer = await response.json()
    if response.status == 200:
        client.pc_id = answer["pc_id"]
        await client.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
    return response.status, answer


async def serve(backend, host_address, grace_s):
    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address, resume_grace_s=grace_s)
    http = TestClient(TestServer(app))
    await http.start_server()
    return http, app


async def test_a_dropped_resumable_peer_reattaches_to_its_conversation(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address, grace_s=30)
    first = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    second = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    stranger = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    try:
        status, answer = await offer(first, http, resumable=True)
        assert status == 200 and answer["resume_token"]
        await until(lambda: first.loud_frames() >= 10, 10, "echoed audio on the first connection")
        conversation = backend.conversations[0]
        await first.close()  # the page's network goes
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to notice")
        assert conversation.closed_reason is None  # parked, not closed

        status, refused = await offer(stranger, http, resume={"pc_id": answer["pc_id"], "resume_token": "nope"})
        assert status == 403 and refused["error"]["code"] == "invalid_resume_token"
        status, again = await offer(second, http, resume={"pc_id": answer["pc_id"],
                                                         "resume_token": answer["resume_token"]})
        assert status == 200 and again["resume_token"] != answer["resume_token"]
        await until(lambda: second.loud_frames() >= 10, 10, "echoed audio on the second connection")
        assert len(backend.conversations) == 1  # the same conversation, no new one
        assert len(conversation.sent_of(SessionUpdate)) == 2
        status, reused = await offer(ClientPeer(host_address, frames_of(tone(1000, rate=48000))), http,
                                     resume={"pc_id": answer["pc_id"], "resume_token": answer["resume_token"]})
        assert status == 404 and reused["error"]["code"] == "session_resume_expired"  # single use
    finally:
        for client in (first, second, stranger):
            await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peers")
        await app[WEBRTC_PEERS].close_all()
        await http.close()
    assert conversation.closed_reason is not None


async def test_nobody_coming_back_closes_the_conversation_after_the_grace_period(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address, grace_s=0.3)
    client = ClientPeer(host_address, frames_of(tone(2000, rate=48000)))
    try:
        await offer(client, http, resumable=True)
        await until(lambda: client.loud_frames() >= 5, 10, "echoed audio")
        await client.close()
        conversation = backend.conversations[0]
        await until(lambda: conversation.closed_reason is not None, 10, "the grace period to end")
        assert conversation.closed_reason == "disconnect_grace_expired"
    finally:
        await http.close()


async def test_a_peer_that_did_not_ask_to_be_resumable_ends_its_conversation_at_once(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address, grace_s=30)
    client = ClientPeer(host_address, frames_of(tone(2000, rate=48000)))
    try:
        status, answer = await offer(client, http)
        assert status == 200 and "resume_token" not in answer
        await until(lambda: client.loud_frames() >= 5, 10, "echoed audio")
        await client.close()
        await until(lambda: backend.conversations[0].closed_reason is not None, 10, "the conversation to close")
    finally:
        await http.close()


async def test_a_hang_up_that_races_the_peer_dropping_still_ends_the_conversation(host_address):
    """The page sends DELETE and closes its peer together: whichever the server sees first, nothing is parked."""
    backend = EchoBackend()
    http, app = await serve(backend, host_address, grace_s=30)
    client = ClientPeer(host_address, frames_of(tone(2000, rate=48000)))
    registry = app[WEBRTC_PEERS]
    try:
        status, answer = await offer(client, http, resumable=True)
        await until(lambda: client.loud_frames() >= 5, 10, "echoed audio")
        session = registry.sessions[answer["pc_id"]]
        registry.finish(session, "connection_closed")  # the drop is seen first; its close has not begun yet
        assert await registry.hang_up(answer["pc_id"])  # the DELETE's handler, in the same loop turn
        conversation = backend.conversations[0]
        await until(lambda: conversation.closed_reason is not None, 10, "the conversation to end")
        assert conversation.closed_reason == "client_close"
        response = await http.delete("/api/offer", json={"pc_id": answer["pc_id"]})
        assert response.status == 404  # nothing is left of it, parked or otherwise
    finally:
        await client.close()
        await registry.close_all()
        await http.close()


async def test_a_resume_that_comes_before_the_drop_is_noticed_takes_the_conversation_over(host_address):
    """The page's network changed and it came back at once: the server still holds its old peer as
    live. The resume with the right token ends that peer and moves the conversation over; a wrong
    token leaves the live call alone."""
    backend = EchoBackend()
    http, app = await serve(backend, host_address, grace_s=30)
    registry = app[WEBRTC_PEERS]
    first = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    stranger = ClientPeer(host_address, frames_of(tone(1000, rate=48000)))
    second = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    try:
        status, answer = await offer(first, http, resumable=True)
        assert status == 200
        await until(lambda: first.loud_frames() >= 10, 10, "echoed audio on the first connection")
        conversation = backend.conversations[0]
        # The first connection is not closed: to the server, the old peer is still live.
        status, refused = await offer(stranger, http, resume={"pc_id": answer["pc_id"], "resume_token": "nope"})
        assert status == 403 and refused["error"]["code"] == "invalid_resume_token"
        assert answer["pc_id"] in registry.sessions and conversation.closed_reason is None
        status, again = await offer(second, http, resume={"pc_id": answer["pc_id"],
                                                         "resume_token": answer["resume_token"]})
        assert status == 200, again
        assert answer["pc_id"] not in registry.sessions and again["pc_id"] in registry.sessions
        await until(lambda: second.loud_frames() >= 10, 10, "echoed audio on the second connection")
        assert len(backend.conversations) == 1 and conversation.closed_reason is None  # the same one, moved over
    finally:
        for client in (first, stranger, second):
            await client.close()
        await until(lambda: not registry.sessions, 10, "the server to free the peers")
        await registry.close_all()
        await http.close()
