"""RED in the server's offer to a subscriber, and what its answer took (the real SDK's side: test_forwarding)."""

from __future__ import annotations

from devtools.livekit_server.subscriber_offer import offer_red, red_taken


def section(mid: str, formats: str, *lines: str, kind: str = "audio") -> list[str]:
    return [f"m={kind} 9 UDP/TLS/RTP/SAVPF {formats}", f"a=mid:{mid}", "a=sendonly", *lines]


def sdp(*sections: list[str]) -> str:
    return "\r\n".join(["v=0", "s=-", *(line for s in sections for line in s)]) + "\r\n"


AIORTC_AUDIO = ("a=rtpmap:96 opus/48000/2", "a=rtpmap:0 PCMU/8000")


def test_red_is_offered_first_over_opus_in_the_chosen_sections_only() -> None:
    offer = sdp(section("0", "96 0", *AIORTC_AUDIO), section("1", "96 0", *AIORTC_AUDIO),
                section("2", "97", "a=rtpmap:97 VP8/90000", kind="video"))
    munged = offer_red(offer, {"1", "2"}).split("m=")
    assert munged[1] == offer.split("m=")[1]  # not chosen
    assert munged[3] == offer.split("m=")[3]  # video
    chosen = munged[2].split("\r\n")
    assert chosen[0] == "audio 9 UDP/TLS/RTP/SAVPF 63 96 0"
    assert chosen[3:6] == ["a=rtpmap:63 red/48000/2", "a=fmtp:63 96/96", "a=rtpmap:96 opus/48000/2"]


def test_the_answer_says_which_sections_took_red_under_which_type() -> None:
    answer = sdp(section("0", "96", "a=rtpmap:96 opus/48000/2"),
                 section("1", "63 96", "a=rtpmap:63 red/48000/2", "a=fmtp:63 96/96", "a=rtpmap:96 opus/48000/2"),
                 section("2", "96", "a=rtpmap:96 opus/48000/2", "a=rtpmap:63 red/48000/2"),  # mapped, not taken
                 section("3", "63 96", "a=inactive", "a=rtpmap:63 red/48000/2"))
    assert red_taken(answer) == {"1": 63}
