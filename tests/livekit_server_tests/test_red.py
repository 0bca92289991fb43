"""RED payloads (RFC 2198) as the loopback server forwards them to each subscriber (the real SDK's side: test_forwarding)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

from aiortc.rtp import RtpPacket

from devtools.livekit_server import red
from devtools.livekit_server.media_relay import ForwardedAudioTrack


def red_payload(primary_pt: int, primary: bytes, *earlier: tuple[int, int, bytes]) -> bytes:
    """Earlier blocks as (payload type, timestamp offset, frame), oldest first."""
    headers = b"".join(struct.pack("!BHB", 0x80 | pt, (offset << 2) | (len(frame) >> 8), len(frame) & 0xFF)
                       for pt, offset, frame in earlier)
    return headers + bytes([primary_pt]) + b"".join(frame for _, _, frame in earlier) + primary


def test_the_primary_is_the_packets_own_frame() -> None:
    payload = red_payload(111, b"now!", (111, 1920, b"two before" * 40), (111, 960, b"one before"))
    assert red.primary(payload) == b"now!"
    assert red.primary(red_payload(111, b"alone")) == b"alone"


def test_every_block_is_renumbered_and_nothing_else_changes() -> None:
    payload = red_payload(111, b"now!", (111, 960, b"one before"))
    renumbered = red.with_payload_type(payload, 96)
    assert renumbered == red_payload(96, b"now!", (96, 960, b"one before"))
    assert red.primary(renumbered) == b"now!"


def test_a_payload_whose_blocks_do_not_fit_is_not_red() -> None:
    whole = red_payload(111, b"now!", (111, 960, b"one before"))
    for broken in (b"", whole[:3], whole[:5 + 9], bytes([0x80 | 111])):
        assert red.primary(broken) is None and red.with_payload_type(broken, 96) is None, broken


class RecordingWriter:
    """What a subscriber's ``RtpWriter`` would put on the wire."""

    def __init__(self, red_payload_type: int | None) -> None:
        self.payload_type, self.red_payload_type = 96, red_payload_type
        self.sent: list[tuple[int, bytes]] = []

    async def write(self, source, sequence_number, timestamp, payload_type, payload) -> int:
        self.sent.append((payload_type, payload))
        return len(self.sent)


async def test_a_red_packet_goes_on_as_red_or_as_its_primary_as_the_subscriber_took_it() -> None:
    forwarder = SimpleNamespace(track_sid="TR_red", red_payload_type=63)
    red_packet = RtpPacket(payload_type=63, payload=red_payload(111, b"now!", (111, 960, b"one before")))
    opus_packet = RtpPacket(payload_type=111, payload=b"plain")
    broken_packet = RtpPacket(payload_type=63, payload=bytes([0x80 | 111]))
    for red_payload_type, expected in ((63, [(63, red_payload(96, b"now!", (96, 960, b"one before"))), (96, b"plain")]),
                                       (None, [(96, b"now!"), (96, b"plain")])):
        track = ForwardedAudioTrack(forwarder, "bob")
        track.writer = RecordingWriter(red_payload_type)
        for packet in (red_packet, opus_packet):
            assert await track.forward(packet) is not None
        assert await track.forward(broken_packet) is None  # dropped, not sent as garbage
        assert track.writer.sent == expected
