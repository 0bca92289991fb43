"""The publisher answer's Opus settings, track by track (the real SDK's side: test_forwarding)."""

from __future__ import annotations

from livekit.protocol import models

from devtools.livekit_server.publisher_answer import configure_publisher_answer


def section(mid: str, msid_track: str, *, fmtp: bool) -> list[str]:
    lines = ["m=audio 9 UDP/TLS/RTP/SAVPF 111 0", f"a=mid:{mid}", "a=sendrecv",
             f"a=msid:stream {msid_track}", "a=rtpmap:111 opus/48000/2", "a=rtpmap:0 PCMU/8000"]
    return lines + (["a=fmtp:111 minptime=10;useinbandfec=1"] if fmtp else [])


def sdp(*sections: list[str]) -> str:
    return "\r\n".join(["v=0", "s=-", *(line for s in sections for line in s)]) + "\r\n"


TRACKS = {
    "cid-default": models.TrackInfo(sid="TR_a"),
    "cid-refused": models.TrackInfo(sid="TR_b", disable_dtx=True),
    "cid-stereo": models.TrackInfo(sid="TR_c", disable_dtx=True, stereo=True),
}


def test_each_track_gets_its_own_settings_and_other_lines_stay() -> None:
    offer = sdp(section("0", "cid-default", fmtp=True), section("1", "cid-refused", fmtp=True),
                section("2", "cid-stereo", fmtp=True), section("3", "cid-unknown", fmtp=True))
    answer = configure_publisher_answer(offer, offer, TRACKS.get)
    lines = answer.split("\r\n")
    fmtps = [line for line in lines if line.startswith("a=fmtp:111")]
    assert fmtps == ["a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1",
                     "a=fmtp:111 minptime=10;useinbandfec=1",
                     "a=fmtp:111 minptime=10;useinbandfec=1;stereo=1;maxaveragebitrate=510000",
                     "a=fmtp:111 minptime=10;useinbandfec=1"]
    assert [line for line in lines if not line.startswith("a=fmtp")] == \
        [line for line in offer.split("\r\n") if not line.startswith("a=fmtp")]


def test_an_answer_without_an_opus_format_line_gets_one_after_its_rtpmap() -> None:
    offer = sdp(section("0", "cid-default", fmtp=False))
    lines = configure_publisher_answer(offer, offer, TRACKS.get).split("\r\n")
    rtpmap = lines.index("a=rtpmap:111 opus/48000/2")
    assert lines[rtpmap + 1] == "a=fmtp:111 usedtx=1"


def test_the_track_is_found_by_the_offers_mid_not_the_answers_order() -> None:
    offer = sdp(section("0", "cid-refused", fmtp=True), section("1", "cid-default", fmtp=True))
    answer = sdp(section("1", "whatever", fmtp=True), section("0", "whatever", fmtp=True))
    fmtps = [line for line in configure_publisher_answer(answer, offer, TRACKS.get).split("\r\n")
             if line.startswith("a=fmtp")]
    assert fmtps == ["a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1", "a=fmtp:111 minptime=10;useinbandfec=1"]
