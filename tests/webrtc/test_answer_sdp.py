"""Our SDP answer asks the caller for Opus in-band FEC (a libwebrtc sender adds FEC only when asked)."""

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duplex_agent.webrtc.direct.answer_sdp import ask_for_opus_fec
from duplex_agent.webrtc.direct.signaling import register_webrtc_routes
from tests.support.audio import tone

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend, EnergyVadModel

AIORTC_ANSWER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 0 8\r\nc=IN IP4 0.0.0.0\r\n"
    "a=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=sctp-port:5000\r\n"
)


def fmtp_of(sdp: str, payload_type: int) -> str | None:
    return next((line.split(" ", 1)[1] for line in sdp.splitlines() if line.startswith(f"a=fmtp:{payload_type} ")), None)


def test_an_opus_answer_without_format_parameters_gets_them_after_its_rtpmap():
    sdp = ask_for_opus_fec(AIORTC_ANSWER)
    assert fmtp_of(sdp, 111) == "minptime=10;useinbandfec=1"
    lines = sdp.split("\r\n")
    assert lines[lines.index("a=rtpmap:111 opus/48000/2") + 1].startswith("a=fmtp:111 ")
    assert fmtp_of(sdp, 0) is None and fmtp_of(sdp, 8) is None  # other codecs are left alone
    assert sdp.endswith("\r\n") and "\n\n" not in sdp.replace("\r\n", "\n")


def test_existing_opus_parameters_are_kept_and_fec_turned_on():
    sdp = AIORTC_ANSWER.replace("a=rtpmap:111 opus/48000/2\r\n",
                                "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 stereo=1;useinbandfec=0;usedtx\r\n")
    assert fmtp_of(ask_for_opus_fec(sdp), 111) == "stereo=1;useinbandfec=1;usedtx;minptime=10"


def test_an_answer_without_opus_is_unchanged():
    sdp = AIORTC_ANSWER.replace("a=rtpmap:111 opus/48000/2\r\n", "").replace(" 111 0 8", " 0 8")
    assert ask_for_opus_fec(sdp) == sdp


@pytest.mark.asyncio
async def test_the_workers_answer_asks_for_fec_and_the_call_connects(host_address):
    app = web.Application()
    register_webrtc_routes(app, EchoBackend(max_sessions=1), host_address=host_address, vad_model=EnergyVadModel())
    async with TestClient(TestServer(app)) as http:
        client = ClientPeer(host_address, frames_of(tone(2000, rate=48000)))
        try:
            await client.connect(http)
            opus = next(line.split()[0].split(":")[1] for line in client.answer_sdp.splitlines()
                        if line.lower().startswith("a=rtpmap:") and " opus/" in line.lower())
            assert "useinbandfec=1" in (fmtp_of(client.answer_sdp, int(opus)) or "")
            assert client.pc.remoteDescription is not None  # aiortc took the answer as it is
        finally:
            await client.close()
