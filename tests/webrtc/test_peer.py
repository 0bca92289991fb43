"""A real aiortc client peer through /api/offer, with the real Silero edge VAD."""

import gc
import weakref

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duplex_agent.agent.protocol.events import (
    PlaybackAck,
    ResponseCancel,
    SessionUpdate,
)
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS, register_webrtc_routes
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend, HumBackend

pytestmark = pytest.mark.asyncio


async def serve(backend, host_address):
    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address)
    http = TestClient(TestServer(app))
    await http.start_server()
    return http, app


async def test_caller_audio_comes_back_through_the_echo_backend(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 25, 10, "echoed audio at the client")
        await until(lambda: "metrics" in client.message_types(), 5, "a metrics message")
        assert {"type": "agent.state", "state": "speaking"} in client.messages
        assert "response.created" in client.message_types()
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        print("echo figures:", session.audio.figures.snapshot())
        assert session.audio.figures.last("output_added_ms") is not None

        for bad in ("not json", '{"type": "session.update", "session": {"overlap_policy": "shout"}}',
                    '{"type": "response.create"}', "x" * 20000):
            client.channel.send(bad)
        client.channel.send('{"type": "session.update", "session": {"overlap_policy": "listen"}}')
        errors = lambda: [m["error"]["code"] for m in client.messages if m["type"] == "error"]  # noqa: E731
        await until(lambda: len(errors()) == 4, 5, "error events for bad page messages")
        assert errors() == ["invalid_json", "invalid_field", "unsupported_event", "message_too_large"]
        await until(lambda: session.audio.overlap_policy == "listen", 5, "the page's settings")
        assert SessionUpdate(session={"overlap_policy": "listen"}) in backend.conversations[0].sent
    finally:
        await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        await http.close()
    assert backend.conversations[0].closed_reason is not None


async def test_caller_speech_over_the_agent_silences_it_at_the_edge(host_address, speech_48k):
    backend = HumBackend(10, done=False)  # a long reply, still going when the caller speaks
    http, app = await serve(backend, host_address)
    caller = np.concatenate([np.full(48000, 1e-4, dtype=np.float32), speech_48k])
    client = ClientPeer(host_address, frames_of(caller))
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 10, 10, "the agent's audio at the client")
        conversation = backend.conversations[0]
        await until(lambda: conversation.sent_of(ResponseCancel), 10, "an edge barge-in")
        cancel = conversation.sent_of(ResponseCancel)[0]
        ack = conversation.sent_of(PlaybackAck)[0]
        assert (cancel.response_id, cancel.reason) == ("talk", "barge_in")
        assert ack.response_id == "talk" and 500 < ack.played_ms < 3000
        figures = app[WEBRTC_PEERS].sessions[client.pc_id].audio.figures
        await until(lambda: figures.last("barge_in_ms") is not None, 1, "the first silent frame")
        barge_in_ms = figures.last("barge_in_ms")
        print(f"barge-in latency over aiortc: {barge_in_ms:.1f} ms; played {ack.played_ms:.0f} ms before it")
        assert barge_in_ms < 100
        # Frames sent before the first silent one may still be on their way (the network, the
        # client's jitter buffer): the barge-in has settled once a silent frame reached the client.
        quiet = lambda frame: float(np.sqrt(np.mean(frame**2))) < 0.05  # noqa: E731
        await until(lambda: quiet(client.received[-1]), 5, "the first silent frame at the client")
        heard, loud = len(client.received), client.loud_frames(0.05)
        await until(lambda: len(client.received) >= heard + 25, 5, "more frames")
        assert client.loud_frames(0.05) == loud  # nothing loud after the barge-in settles
    finally:
        await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        await http.close()


async def test_a_finished_call_leaves_nothing_of_itself_alive(host_address):
    """Once a call has ended, nothing holds its peer connection, session or conversation: a worker
    that serves calls for weeks would otherwise keep every one it ever served."""
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(4000, rate=48000)))
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 25, 10, "echoed audio at the client")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        assert session.consent  # our consent keeper and datagram guard sit on its ICE connections
        left = [weakref.ref(session), weakref.ref(session.pc), weakref.ref(session.consent[0])]
        del session
    finally:
        await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        await http.close()
    gc.collect()
    assert [type(ref()).__name__ for ref in left if ref() is not None] == []
