"""RED audio payloads (RFC 2198), as LiveKit's SFU forwards them.

A RED packet carries its Opus frame and, before it, copies of the frames of earlier
packets, so a subscriber that lost a packet rebuilds its frame from the next one. The
payload opens with one 4-byte header per earlier frame (F=1, the frame's payload type,
its timestamp offset, its length), then a 1-byte header (F=0, the payload type of the
packet's own frame), then the earlier frames and last the packet's own.

LiveKit forwards RED as it came to a subscriber that takes RED, and only the packet's
own frame (the primary) to one that does not. Our subscribers may number Opus
differently from the publisher, so each header's payload type is rewritten on the way.
"""

from __future__ import annotations

RTPMAP = "red/48000/2"  # livekit/protocol's RedCodecParameters, as its SFU offers RED
PAYLOAD_TYPE = 63


def _layout(payload: bytes) -> tuple[list[int], int] | None:
    """Where each block header begins, and where the packet's own frame begins; None for a
    payload whose headers or lengths do not fit it."""
    headers, at, earlier = [], 0, 0
    while True:
        if at >= len(payload):
            return None
        headers.append(at)
        if not payload[at] & 0x80:  # F=0: the last header, one byte
            at += 1
            break
        if at + 4 > len(payload):
            return None
        earlier += ((payload[at + 2] & 0x03) << 8) | payload[at + 3]
        at += 4
    if at + earlier > len(payload):
        return None
    return headers, at + earlier


def primary(payload: bytes) -> bytes | None:
    """The packet's own frame (None: not a RED payload)."""
    layout = _layout(payload)
    return None if layout is None else payload[layout[1]:]


def with_payload_type(payload: bytes, payload_type: int) -> bytes | None:
    """``payload`` with every block numbered ``payload_type`` (None: not a RED payload)."""
    layout = _layout(payload)
    if layout is None:
        return None
    out = bytearray(payload)
    for at in layout[0]:
        out[at] = (out[at] & 0x80) | (payload_type & 0x7F)
    return bytes(out)
