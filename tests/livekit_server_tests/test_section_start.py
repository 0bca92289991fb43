"""A section negotiated while DTLS is still handshaking starts once the connection is up.

The server's subscriber connection, as on the v0 signal path: the server offers it with a data
channel alone, and the subscribed track comes in a second offer. Here that second negotiation
finishes while the handshake is held back (as loss on the link holds it back for seconds); once
the handshake completes, the track's packets must reach the subscriber.
"""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import AudioStreamTrack

from devtools.livekit_server.aiortc_seams import start_sections_once_connected
from duplex_agent.webrtc.direct.host_address import candidates_on, interface_ipv4
from tests.support.waits import until


@pytest.fixture
def host_address() -> str:
    try:
        return interface_ipv4()
    except ValueError:
        pytest.skip("no non-loopback IPv4 interface for ICE")


async def negotiate(offerer: RTCPeerConnection, answerer: RTCPeerConnection, address: str) -> None:
    with candidates_on(address):
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(offerer.localDescription)
        await answerer.setLocalDescription(await answerer.createAnswer())
        await offerer.setRemoteDescription(answerer.localDescription)


@pytest.mark.parametrize("seam", [True, False], ids=["with the seam", "aiortc alone"])
async def test_a_track_negotiated_during_the_handshake_reaches_the_subscriber(host_address, seam):
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    subscriber = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    # The subscriber stands in for libwebrtc, which starts a section whenever it is negotiated.
    start_sections_once_connected(subscriber)
    if seam:
        start_sections_once_connected(server)
    received: list[object] = []

    @subscriber.on("track")
    def _on_track(track) -> None:  # noqa: ANN001
        async def read() -> None:
            received.append(await track.recv())

        asyncio.ensure_future(read())

    try:
        server.createDataChannel("_reliable")
        await negotiate(server, subscriber, host_address)
        dtls = server.sctp.transport
        handshake, go_on = dtls._do_handshake, asyncio.Event()

        async def held_handshake() -> None:
            await go_on.wait()
            await handshake()

        dtls._do_handshake = held_handshake  # the server's side of the handshake waits for go_on
        await until(lambda: dtls.state == "connecting", 20, "the handshake under way")
        server.addTransceiver(AudioStreamTrack(), direction="sendonly")
        await negotiate(server, subscriber, host_address)
        go_on.set()
        await until(lambda: server.connectionState == "connected", 20, "the connection up")
        if seam:
            await until(lambda: bool(received), 10, "the track's first frame at the subscriber")
        else:  # aiortc's own connect steps skipped the section: nothing is ever sent on it
            with pytest.raises(AssertionError):
                await until(lambda: bool(received), 3, "the track's first frame at the subscriber")
    finally:
        await server.close()
        await subscriber.close()
