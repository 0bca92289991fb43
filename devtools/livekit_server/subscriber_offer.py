"""RED in the server's offer to a subscriber, as LiveKit's SFU offers it.

A track published with RED goes to each subscriber as RED when the subscriber takes it, and as
plain Opus when it does not (``red.primary``). aiortc knows no RED, so the server writes it into
its offer itself, under LiveKit's payload type, and reads from the answer which sections took it.
"""

from __future__ import annotations

from . import red
from . import sdp_sections as sdp


def offer_red(offer_sdp: str, mids: set[str]) -> str:
    """``offer_sdp`` with RED first, over its Opus, in each audio section whose mid is in ``mids``."""
    sections = sdp.split(offer_sdp)
    for i, section in enumerate(sections[1:], 1):
        opus = sdp.payload_type(section, "opus")
        if sdp.is_live_audio(section) and sdp.mid(section) in mids and opus is not None:
            sections[i] = sdp.with_codec_first(section, red.PAYLOAD_TYPE, red.RTPMAP, f"{opus}/{opus}")
    return sdp.join(sections)


def red_taken(answer_sdp: str) -> dict[str, int]:
    """By mid: the RED payload type of each audio section whose answer kept RED."""
    taken = {}
    for section in sdp.split(answer_sdp)[1:]:
        pt, mid = sdp.payload_type(section, "red"), sdp.mid(section)
        if sdp.is_live_audio(section) and pt is not None and mid is not None and str(pt) in sdp.formats(section):
            taken[mid] = pt
    return taken
