"""The Opus settings LiveKit's SFU writes into its answer to a publisher: DTX on unless refused.

livekit-server (``configurePublisherAnswer``) adds ``usedtx=1`` to an audio track's Opus format
in its answer unless the track was added with ``disable_dtx``, and ``stereo=1;
maxaveragebitrate=510000`` to a stereo one. The publisher's WebRTC then sends DTX: through
silence, one packet in 200-400 ms instead of one every 20 ms. The SDKs publish with DTX on
unless told otherwise (livekit-client, and the Rust core behind ``livekit.rtc``), so behind
LiveKit nearly every quiet caller and agent sends that way; a loopback server that answered
without it would have every test and figure see a stream LiveKit never carries.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from livekit.protocol import models

from .media_relay import media_sections

_OPUS_RTPMAP = re.compile(r"a=rtpmap:(\d+) opus/", re.IGNORECASE)


def opus_settings(track: models.TrackInfo) -> str:
    """What the answer adds to the track's Opus format (empty: nothing)."""
    settings = [] if track.disable_dtx else ["usedtx=1"]
    if track.stereo:
        settings.append("stereo=1;maxaveragebitrate=510000")
    return ";".join(settings)


def configure_publisher_answer(answer_sdp: str, offer_sdp: str,
                               audio_track: Callable[[str], models.TrackInfo | None]) -> str:
    """``answer_sdp`` with each published audio track's Opus settings, found by the offer's msid.

    ``audio_track`` maps the offer's msid track id (the SDK's cid) to the track it added.
    """
    track_of_mid = {s["mid"]: s["track_id"] for s in media_sections(offer_sdp) if s["kind"] == "audio"}
    sections: list[list[str]] = [[]]
    for line in answer_sdp.split("\r\n"):
        if line.startswith("m="):
            sections.append([])
        sections[-1].append(line)
    out = sections[0]
    for section in sections[1:]:
        out += _with_settings(section, track_of_mid, audio_track)
    return "\r\n".join(out)


def _with_settings(section: list[str], track_of_mid: dict[str, str | None],
                   audio_track: Callable[[str], models.TrackInfo | None]) -> list[str]:
    if not section[0].startswith("m=audio") or "a=inactive" in section:
        return section
    mid = next((line[len("a=mid:"):] for line in section if line.startswith("a=mid:")), None)
    cid = track_of_mid.get(mid) if mid is not None else None
    track = audio_track(cid) if cid else None
    settings = opus_settings(track) if track is not None else ""
    opus = next((m[1] for line in section if (m := _OPUS_RTPMAP.match(line))), None)
    if not settings or opus is None:
        return section
    fmtp = f"a=fmtp:{opus} "
    for i, line in enumerate(section):
        if line.startswith(fmtp):
            return section[:i] + [f"{line};{settings}"] + section[i + 1:]
    rtpmap = next(i for i, line in enumerate(section) if line.startswith(f"a=rtpmap:{opus} "))
    return section[:rtpmap + 1] + [fmtp + settings] + section[rtpmap + 1:]
