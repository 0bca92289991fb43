"""RED to a subscriber, as LiveKit's SFU offers it.

A track published with RED goes to each subscriber as RED when the subscriber takes it, and as
plain Opus when it does not (``red.primary``). aiortc knows no RED, so the server writes it into
its offer itself, under LiveKit's payload type, and reads from the answer which sections took it
(``offer_red``, ``red_taken``: the subscriber peer connection of the v0 signal path). On the v1
path (one peer connection) the subscriber offers the sections it receives on, and the server
answers: RED goes first in the answer's section where the subscriber offered it over its Opus
(``answer_red``).
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


def answer_red(answer_sdp: str, offer_sdp: str, mids: set[str]) -> tuple[str, dict[str, int]]:
    """``answer_sdp`` with RED first, over its Opus, in each audio section whose mid is in
    ``mids`` and whose offer has RED over that Opus; and by mid, the RED payload type taken."""
    offered = {sdp.mid(s): s for s in sdp.split(offer_sdp)[1:]}
    sections, taken = sdp.split(answer_sdp), {}
    for i, section in enumerate(sections[1:], 1):
        mid, opus = sdp.mid(section), sdp.payload_type(section, "opus")
        offer = offered.get(mid)
        if mid not in mids or offer is None or opus is None or not sdp.is_live_audio(section):
            continue
        red_pt = sdp.payload_type(offer, "red")
        if red_pt is not None and str(opus) in (sdp.fmtp(offer, red_pt) or "").split("/"):
            sections[i] = sdp.with_codec_first(section, red_pt, red.RTPMAP, f"{opus}/{opus}")
            taken[mid] = red_pt
    return sdp.join(sections), taken
