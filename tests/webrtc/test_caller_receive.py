"""The caller's receive path on a real aiortc connection: our buffer serves the call; its figures reach /metrics per call and in total; garbage payloads, an
SSRC change, a sequence jump of thousands and a timestamp wrap from a real sender are counted
(and concealed) while the call goes on; the caller's receiver reports set the agent's FEC."""

from __future__ import annotations

import asyncio
import re

import av
import numpy as np

from duplex_agent.agent import metrics
from duplex_agent.agent.protocol.events import InputAudioBufferAppend
from duplex_agent.webrtc.direct import loss_feedback
from duplex_agent.webrtc.direct.caller_receive import AdaptiveCallerAudioReader
from duplex_agent.webrtc.direct.loss_feedback import LossFollower
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS, register_webrtc_routes
from duplex_agent.webrtc.direct.tracks import OpusVoiceEncoder, PlayoutTrack
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend
from .test_peer import serve


def _sample(name: str, **labels: str) -> float | None:
    wanted = "".join(f'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    match = re.search(rf"^{name}\{{{wanted}[^}}]*\}} (\S+)$", metrics.render().decode(), re.MULTILINE)
    return float(match.group(1)) if match else None


def _input_ms(conversation) -> float:
    """The caller's timeline as the conversation got it."""
    appended = [e for e in conversation.sent if isinstance(e, InputAudioBufferAppend)]
    return sum(1000.0 * e.audio.size / e.sample_rate_hz for e in appended)


async def test_our_buffer_serves_the_call_and_reports_per_call_and_in_total(host_address, monkeypatch):
    monkeypatch.setattr(loss_feedback, "POLL_INTERVAL_S", 0.2)
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    total_before = _sample("duplex_receive_frames_total", outcome="received") or 0.0
    try:
        await client.connect(http)
        await until(lambda: client.loud_frames() >= 25, 20, "the caller's audio echoed back")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        reader = session.caller_reader
        assert isinstance(reader, AdaptiveCallerAudioReader)
        await until(lambda: reader.buffer.counts.received >= 50, 20, "a second of the caller's packets")
        counts = reader.buffer.counts
        assert counts.invalid == counts.ssrc_changes == 0
        # What the conversation got is exactly the timeline the buffer handed on (whole 20 ms frames).
        assert counts.samples_out == 960 * (counts.received + counts.recovered + counts.concealed)

        per_call = _sample("duplex_receive_call_frames", call=client.pc_id, outcome="received")
        assert per_call is not None and per_call >= 50
        assert _sample("duplex_receive_call_delay_ms", call=client.pc_id, stat="target") > 0
        assert _sample("duplex_receive_call_delay_ms", call=client.pc_id, stat="p95") is not None
        assert _sample("duplex_receive_frames_total", outcome="received") >= total_before + 50

        # The caller's receiver reports say nothing is lost: the agent's Opus stops spending bits on FEC.
        await until(lambda: len(session.loss_follower.reports) >= 1, 20, "a receiver report from the caller")
        await until(lambda: not session.playout_track.encoder.fec, 10, "FEC off on a clean path")
        assert session.playout_track.encoder.expected_loss_percent == 0
    finally:
        await client.close()
    await until(lambda: _sample("duplex_receive_call_frames", call=client.pc_id, outcome="received") is None,
                   10, "the call's own figures to go with it")
    assert _sample("duplex_receive_frames_total", outcome="received") >= total_before + per_call  # kept in the total
    await http.close()


async def serve_with(backend, host_address, **options):
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    app = web.Application()
    register_webrtc_routes(app, backend, host_address=host_address, **options)
    http = TestClient(TestServer(app))
    await http.start_server()
    return http, app


class GarblingTrack(PlayoutTrack):
    """Sends its frames as Opus, except packets ``bad`` (by index), which go as ``garbage(index)``."""

    def __init__(self, next_frame, bad: range, garbage) -> None:
        super().__init__(next_frame)
        self.bad, self.garbage, self.sent = bad, garbage, 0

    async def recv(self) -> av.Packet:
        packet = await super().recv()
        index, self.sent = self.sent, self.sent + 1
        if index in self.bad:
            replaced = av.Packet(self.garbage(index))
            replaced.pts, replaced.time_base = packet.pts, packet.time_base
            return replaced
        return packet


async def test_garbage_and_truncated_payloads_from_a_real_sender_are_concealed_and_the_call_goes_on(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    rng = np.random.default_rng(3)
    real = OpusVoiceEncoder()
    frame = (tone(20, rate=48000) * 32767).astype(np.int16)
    garbage = lambda i: b"\xff" + rng.bytes(30) if i % 2 else real.encode(frame)[:2]  # noqa: E731
    track = GarblingTrack(frames_of(tone(30000, rate=48000)), range(100, 120), garbage)
    client.pc.getSenders()[0].replaceTrack(track)
    try:
        await client.connect(http)
        await until(lambda: client.pc_id in app[WEBRTC_PEERS].sessions and track.sent > 200, 30,
                       "the caller to send past the garbage")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        counts = session.caller_reader.buffer.counts
        await until(lambda: counts.received >= 150, 20, "the caller's packets after the garbage")
        assert counts.invalid >= 10  # the unparseable half at least; a truncated packet may decode to noise
        assert counts.concealed >= 10
        assert counts.samples_out == 960 * (counts.received + counts.recovered + counts.concealed)
        assert session.closed is False and client.pc.connectionState == "connected"
        conversation = backend.conversations[0]
        await until(lambda: _input_ms(conversation) >= 3000, 20, "3 s of the caller's timeline at the conversation")
    finally:
        await client.close()
        await http.close()


def test_fec_follows_the_worst_of_the_recent_receiver_reports():
    encoder = OpusVoiceEncoder()
    follower = LossFollower(encoder)
    assert follower.report(0) == 0 and not encoder.fec  # nothing lost: no bits spent on FEC
    assert follower.report(26) == 11 and encoder.fec  # 26/256 = 10.2 % lost
    assert follower.report(0) == 11  # one clean report does not forget the loss
    for _ in range(3):
        follower.report(0)
    assert encoder.expected_loss_percent == 0 and not encoder.fec
    assert follower.report(255) == loss_feedback.MAX_EXPECTED_LOSS_PERCENT


class PausingTrack(PlayoutTrack):
    """Sends nothing for ``pause_s`` after ``before`` packets, then carries on (its RTP clock paused too)."""

    def __init__(self, next_frame, before: int, pause_s: float) -> None:
        super().__init__(next_frame)
        self.before, self.pause_s, self.sent = before, pause_s, 0
        self.resumed = False

    async def recv(self) -> av.Packet:
        if self.sent == self.before:
            await asyncio.sleep(self.pause_s)
            self.resumed = True
        self.sent += 1
        return await super().recv()


async def test_a_caller_silent_for_3_s_is_heard_again_when_packets_return(host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    track = PausingTrack(frames_of(tone(30000, rate=48000)), before=50, pause_s=3.0)
    client.pc.getSenders()[0].replaceTrack(track)
    try:
        await client.connect(http)
        await until(lambda: track.resumed, 30, "the caller's 3 s without packets")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        counts = session.caller_reader.buffer.counts
        received_at_resume = counts.received
        # The 3 s were filled as they passed (the first OPEN_HOLE_GRACE_S waited, late timers on a
        # busy loop wait as long again): the timeline ran on.
        assert counts.concealed >= 75
        await until(lambda: counts.received >= received_at_resume + 50, 20, "a second of packets after the pause")
        assert counts.timestamp_jumps >= 1  # its RTP clock stood still: a restart, not 3 s of late packets
        assert not session.closed and client.pc.connectionState == "connected"
        heard = client.loud_frames()
        await until(lambda: client.loud_frames() >= heard + 25, 20, "the caller's audio echoed again")
    finally:
        await client.close()
        await http.close()


class RtpRewriter:
    """The caller's RTP as it leaves (plain, before SRTP): from packet ``start`` on, its sequence
    numbers jump by ``sequence_jump``, its SSRC becomes ``ssrc``; every timestamp is shifted so
    that the 32-bit RTP clock wraps ``wrap_after`` packets in."""

    def __init__(self, sender, *, start: int, sequence_jump: int, ssrc: int, wrap_after: int) -> None:
        self.start, self.sequence_jump, self.ssrc, self.wrap_after = start, sequence_jump, ssrc, wrap_after
        self.sent = 0
        self.wrapped = False  # a timestamp went out smaller than the one before it
        self._shift: int | None = None
        self._last_timestamp = -1
        transport = sender.transport
        send = transport._send_rtp
        transport._send_rtp = lambda data: send(self.rewrite(data))

    def rewrite(self, data: bytes) -> bytes:
        if len(data) < 12 or 192 <= data[1] <= 223:  # RTCP (payload types 192-223) goes as it is
            return data
        packet = bytearray(data)
        timestamp = int.from_bytes(packet[4:8], "big")
        if self._shift is None:
            self._shift = (1 << 32) - timestamp - self.wrap_after * 960
        shifted = (timestamp + self._shift) % (1 << 32)
        self.wrapped |= shifted < self._last_timestamp
        self._last_timestamp = shifted
        packet[4:8] = shifted.to_bytes(4, "big")
        if self.sent >= self.start:
            sequence = (int.from_bytes(packet[2:4], "big") + self.sequence_jump) % (1 << 16)
            packet[2:4] = sequence.to_bytes(2, "big")
            packet[8:12] = self.ssrc.to_bytes(4, "big")
        self.sent += 1
        return bytes(packet)


async def test_a_real_senders_ssrc_change_sequence_jump_and_timestamp_wrap_are_counted_and_the_call_goes_on(
        host_address):
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    rewriter = RtpRewriter(client.pc.getSenders()[0], start=100, sequence_jump=5000, ssrc=0x5EED, wrap_after=50)
    try:
        await client.connect(http)
        await until(lambda: rewriter.sent > 250, 30, "the caller to send past the wrap, the jump and the change")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        counts = session.caller_reader.buffer.counts
        assert rewriter.wrapped
        await until(lambda: counts.received >= 200, 20, "the caller's packets on both sides of the change")
        assert counts.ssrc_changes == 1
        assert counts.sequence_jumps >= 1
        assert counts.invalid == 0
        assert counts.samples_out == 960 * (counts.received + counts.recovered + counts.concealed)
        assert session.closed is False and client.pc.connectionState == "connected"
        heard = client.loud_frames()
        await until(lambda: client.loud_frames() >= heard + 25, 20, "the caller's audio echoed after the change")
        await until(lambda: _input_ms(backend.conversations[0]) >= 4000, 20,
                       "4 s of the caller's timeline at the conversation")
    finally:
        await client.close()
        await http.close()
