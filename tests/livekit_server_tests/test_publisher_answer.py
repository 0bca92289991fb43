"""The publisher answer's Opus and RED settings, track by track (the real SDK's side: test_forwarding)."""

from __future__ import annotations

from livekit.protocol import models

from devtools.livekit_server.publisher_answer import configure_publisher_answer, red_payload_types


def section(mid: str, msid_track: str, *, fmtp: bool, red: str | None = None) -> list[str]:
    """An audio section; ``red``: the format line of a RED (type 63) it offers."""
    lines = [f"m=audio 9 UDP/TLS/RTP/SAVPF 111{' 63' if red else ''} 0", f"a=mid:{mid}", "a=sendrecv",
             f"a=msid:stream {msid_track}", "a=rtpmap:111 opus/48000/2", "a=rtpmap:0 PCMU/8000"]
    lines += ["a=fmtp:111 minptime=10;useinbandfec=1"] if fmtp else []
    return lines + (["a=rtpmap:63 red/48000/2", f"a=fmtp:63 {red}"] if red else [])


def sdp(*sections: list[str]) -> str:
    return "\r\n".join(["v=0", "s=-", *(line for s in sections for line in s)]) + "\r\n"


TRACKS = {
    "cid-default": models.TrackInfo(sid="TR_a"),
    "cid-refused": models.TrackInfo(sid="TR_b", disable_dtx=True),
    "cid-stereo": models.TrackInfo(sid="TR_c", disable_dtx=True, stereo=True),
    "cid-no-red": models.TrackInfo(sid="TR_d", disable_red=True),
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


def test_an_answer_without_an_opus_format_line_gets_livekits_after_its_rtpmap() -> None:
    # aiortc's own answer: Opus with no format line, so no in-band FEC for the publisher
    answer = sdp(section("0", "cid-default", fmtp=False), section("1", "cid-unknown", fmtp=False))
    lines = configure_publisher_answer(answer, answer, TRACKS.get).split("\r\n")
    rtpmaps = [i for i, line in enumerate(lines) if line == "a=rtpmap:111 opus/48000/2"]
    assert [lines[i + 1] for i in rtpmaps] == ["a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1",
                                               "a=fmtp:111 minptime=10;useinbandfec=1"]


def test_the_track_is_found_by_the_offers_mid_not_the_answers_order() -> None:
    offer = sdp(section("0", "cid-refused", fmtp=True), section("1", "cid-default", fmtp=True))
    answer = sdp(section("1", "whatever", fmtp=True), section("0", "whatever", fmtp=True))
    fmtps = [line for line in configure_publisher_answer(answer, offer, TRACKS.get).split("\r\n")
             if line.startswith("a=fmtp")]
    assert fmtps == ["a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1", "a=fmtp:111 minptime=10;useinbandfec=1"]


def test_red_goes_first_for_a_track_that_offers_it_over_its_opus_and_did_not_refuse_it() -> None:
    offer = sdp(section("0", "cid-default", fmtp=True, red="111/111"),
                section("1", "cid-no-red", fmtp=True, red="111/111"),
                section("2", "cid-stereo", fmtp=True, red="96/96"),  # RED over another codec
                section("3", "cid-unknown", fmtp=True, red="111/111"),
                section("4", "cid-refused", fmtp=True))
    assert red_payload_types(offer, TRACKS.get) == {"0": 63}
    answer = sdp(*(section(str(mid), "whatever", fmtp=False) for mid in range(5)))  # as aiortc answers
    sections = configure_publisher_answer(answer, offer, TRACKS.get).split("m=")[1:]
    first = sections[0].split("\r\n")
    assert first[0] == "audio 9 UDP/TLS/RTP/SAVPF 63 111 0"
    assert first.index("a=rtpmap:63 red/48000/2") < first.index("a=rtpmap:111 opus/48000/2")
    assert "a=fmtp:63 111/111" in first
    for other in sections[1:]:
        assert other.startswith("audio 9 UDP/TLS/RTP/SAVPF 111 0") and "red/" not in other, other
