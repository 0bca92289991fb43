"""The audio settings LiveKit's SFU writes into its answer to a publisher.

- Opus in the format LiveKit registers, ``minptime=10;useinbandfec=1``: the publisher's encoder
  may then add in-band FEC once its receiver reports loss.
- ``usedtx=1`` added to it unless the track was added with ``disable_dtx``, and
  ``stereo=1;maxaveragebitrate=510000`` for a stereo track (``configurePublisherAnswer``).
  Through silence the publisher then sends one packet in 200-400 ms, not one every 20 ms.
- RED first, for a track that did not refuse it and whose offer has RED over its Opus
  (``setCodecPreferencesOpusRedForPublisher``): each packet then carries a copy of the frame
  before it, which a subscriber that lost that packet decodes instead.

The SDKs publish with DTX and RED on unless told otherwise (livekit-client, and the Rust core
behind ``livekit.rtc``), so behind LiveKit nearly every caller and agent sends that way; a
loopback server that answered as aiortc does would have every test and figure see streams
LiveKit never carries.
"""

from __future__ import annotations

from collections.abc import Callable

from livekit.protocol import models

from . import red
from . import sdp_sections as sdp

OPUS_FORMAT = "minptime=10;useinbandfec=1"  # livekit/protocol's OpusCodecParameters

AudioTrackOf = Callable[[str], models.TrackInfo | None]  # the offer's msid track id (the cid) -> track


def opus_format(track: models.TrackInfo | None) -> str:
    """The answer's Opus format for ``track`` (None: a section with no track the publisher added)."""
    settings = [OPUS_FORMAT]
    if track is not None and not track.disable_dtx:
        settings.append("usedtx=1")
    if track is not None and track.stereo:
        settings.append("stereo=1;maxaveragebitrate=510000")
    return ";".join(settings)


def red_payload_types(offer_sdp: str, audio_track: AudioTrackOf) -> dict[str, int]:
    """By mid: the RED payload type the answer puts first, for each audio track that did not
    refuse RED and whose offer has RED over its Opus (a format line naming Opus's type)."""
    chosen = {}
    for section in sdp.split(offer_sdp)[1:]:
        track = _track(section, audio_track)
        opus, red_pt, mid = sdp.payload_type(section, "opus"), sdp.payload_type(section, "red"), sdp.mid(section)
        if track is None or track.disable_red or opus is None or red_pt is None or mid is None:
            continue
        if str(opus) in (sdp.fmtp(section, red_pt) or "").split("/"):
            chosen[mid] = red_pt
    return chosen


def configure_publisher_answer(answer_sdp: str, offer_sdp: str, audio_track: AudioTrackOf) -> str:
    """``answer_sdp`` with each audio section's Opus format, and RED first where chosen; each
    section's track is found through the offer's mid and msid."""
    offered = {sdp.mid(s): s for s in sdp.split(offer_sdp)[1:]}
    red_of_mid = red_payload_types(offer_sdp, audio_track)
    sections = sdp.split(answer_sdp)
    for i, section in enumerate(sections[1:], 1):
        opus, mid = sdp.payload_type(section, "opus"), sdp.mid(section)
        if not sdp.is_live_audio(section) or opus is None:
            continue
        section = sdp.with_fmtp(section, opus, opus_format(_track(offered.get(mid), audio_track)))
        if mid in red_of_mid:
            section = sdp.with_codec_first(section, red_of_mid[mid], red.RTPMAP, f"{opus}/{opus}")
        sections[i] = section
    return sdp.join(sections)


def _track(offer_section: sdp.Section | None, audio_track: AudioTrackOf) -> models.TrackInfo | None:
    cid = sdp.msid_track(offer_section) if offer_section else None
    return audio_track(cid) if cid else None
