"""An empty UDP datagram to a direct call's port, from anyone: aiortc alone ends the call on it; the
worker drops it (webrtc/direct/datagram_guard.py) and the call goes on."""

from __future__ import annotations

import socket

from duplex_agent.webrtc.direct import peer_session
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend
from .test_caller_receive import serve_with


def send_empty_datagram(host_address: str, session) -> None:  # noqa: ANN001
    """From a socket of its own (not the caller's address), to the worker's end of the call."""
    port = session.consent[0].connection.local_candidates[0].port
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        stranger.sendto(b"", (host_address, port))


async def test_an_empty_datagram_does_not_end_the_call(host_address):
    backend = EchoBackend()
    http, app = await serve_with(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(60000, rate=48000)))
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 25, 20, "the echo at the caller")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        send_empty_datagram(host_address, session)
        await until(lambda: sum(g.dropped for g in session.datagram_guards) == 1, 10, "the datagram to be dropped")
        heard = client.loud_frames()
        await until(lambda: client.loud_frames() >= heard + 50, 20, "the echo going on")
        assert client.pc_id in app[WEBRTC_PEERS].sessions and session.pc.connectionState == "connected"
    finally:
        await client.close()
        await http.close()


async def test_without_the_guard_aiortc_ends_the_call_on_it(host_address, monkeypatch):
    """Why the guard is there: when this fails, aiortc takes empty datagrams and the guard can go."""
    monkeypatch.setattr(peer_session, "drop_empty_datagrams", lambda pc: [])
    backend = EchoBackend()
    http, app = await serve_with(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(60000, rate=48000)))
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 25, 20, "the echo at the caller")
        send_empty_datagram(host_address, app[WEBRTC_PEERS].sessions[client.pc_id])
        await until(lambda: client.pc_id not in app[WEBRTC_PEERS].sessions, 10, "the worker to lose the call")
    finally:
        await client.close()
        await http.close()
