"""The loopback server's SIP service through livekit-api, as an agent would use it: a call to a
phone joins the room as a SIP participant with LiveKit's attributes, over a phone line both ways,
with DTMF both ways; refusals, timeouts, grants and transfers come back as LiveKit's errors."""

from __future__ import annotations

import asyncio
import datetime

import numpy as np
import pytest
from livekit import api, rtc
from livekit.protocol import sip as sip_pb

from devtools.livekit_server.sip import Answer, Phone, SipStatus
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from tests.support.audio import tone
from tests.support.waits import until

NUMBER = "+15551230001"


def band_level(samples: np.ndarray, rate: int, hz: float) -> float:
    """Magnitude of ``samples`` at ``hz`` (a windowed DFT bin), for telling a tone through the line."""
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    freqs = np.fft.rfftfreq(samples.size, 1 / rate)
    return float(spectrum[np.argmin(np.abs(freqs - hz))] / samples.size)


class AgentSide:
    """A participant standing in for the agent: hears the phone, speaks a tone, sends and gets DTMF."""

    def __init__(self) -> None:
        self.room = rtc.Room()
        self.heard: list[np.ndarray] = []
        self.keys: list[str] = []
        self._tasks: list[asyncio.Task] = []
        self.source = AgentVoiceSource(48000, 1, queue_size_ms=60)
        self.room.on("track_subscribed", self._on_track)
        self.room.on("sip_dtmf_received", lambda dtmf: self.keys.append(dtmf.digit))

    async def join(self, url: str, token: str) -> None:
        await self.room.connect(url, token)
        FfiRouter.shared().own_room(self.room)
        track = rtc.LocalAudioTrack.create_audio_track("agent", self.source.source)
        await self.room.local_participant.publish_track(track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))

    def speak_tone(self, hz: float, ms: float) -> None:
        async def feed() -> None:
            audio = tone(ms, hz, rate=48000, level=0.3)
            for start in range(0, audio.size, 960):
                pcm = (audio[start:start + 960] * 32767).astype(np.int16)
                await self.source.capture_frame(rtc.AudioFrame(pcm.tobytes(), 48000, 1, pcm.size))

        self._tasks.append(asyncio.create_task(feed()))

    def _on_track(self, track: rtc.Track, publication, participant) -> None:
        async def listen() -> None:
            stream = CallerAudioStream(track, 48000, frame_size_ms=20)
            try:
                async for frame in stream:
                    self.heard.append(np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768)
            finally:
                await stream.aclose()

        self._tasks.append(asyncio.create_task(listen()))

    def loud_since(self, start: int) -> np.ndarray:
        audio = np.concatenate(self.heard[start:]) if len(self.heard) > start else np.zeros(0, np.float32)
        return audio

    async def leave(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self.room.disconnect(), 10)
        await self.source.aclose()


def dial(room: str, trunk: str, number: str = NUMBER, **fields) -> sip_pb.CreateSIPParticipantRequest:
    return sip_pb.CreateSIPParticipantRequest(sip_trunk_id=trunk, sip_call_to=number, room_name=room,
                                              wait_until_answered=True, **fields)


async def test_answered_call_over_a_phone_line_with_dtmf_and_transfers(server):
    trunk = await server.add_sip_trunk(("+15550100000",))
    greeting = np.concatenate([tone(600, 1000, rate=48000), tone(600, 150, rate=48000)])
    await server.add_phone(NUMBER, Phone(rings_for_s=0.5, greeting=greeting))
    await server.add_phone("+15557770000", Phone(refuses_transfer=SipStatus(603, "Decline")))
    await server.add_phone("+15558880000", Phone())
    agent = AgentSide()
    await agent.join(server.url, server.mint_token("agent", "out-1", kind="agent", agent=True))
    lkapi = api.LiveKitAPI(server.url.replace("ws", "http"), server.api_key, server.api_secret)
    try:
        heard_before = len(agent.heard)
        info = await lkapi.sip.create_sip_participant(dial("out-1", trunk, dtmf="12w#", participant_identity="callee"))
        call = server.sip_calls()[info.sip_call_id]
        assert call.answered_at is not None and call.status == "active"
        assert [k.digit for k in call.keys if k.source == "dial"] == ["1", "2", "#"]

        participant = server.rooms["out-1"].participants["callee"]
        assert participant.info.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP
        attributes = dict(participant.info.attributes)
        assert attributes["sip.callID"] == info.sip_call_id and attributes["sip.phoneNumber"] == NUMBER
        assert attributes["sip.trunkID"] == trunk and attributes["sip.trunkPhoneNumber"] == "+15550100000"
        await until(lambda: server.rooms["out-1"].participants["callee"].info.attributes["sip.callStatus"] == "active",
                    10, "the call's status to reach the room")

        # The greeting through the line: 1 kHz passes, 150 Hz (below the voice band) does not. Its start is
        # found by its tone: the dialled keys can reach the agent's ear first, as the line carries them.
        def greeting_start() -> int | None:
            received = agent.loud_since(heard_before)
            window, step = 24000, 2400  # half a second of the tone: a dialled key's burst is shorter
            return next((i for i in range(0, received.size - window, step)
                         if band_level(received[i:i + window], 48000, 1000) > 0.03), None)

        await until(lambda: (start := greeting_start()) is not None
                    and agent.loud_since(heard_before).size > start + 48000 * 1.2, 20, "the greeting", every=0.2)
        received = agent.loud_since(heard_before)
        start = greeting_start()
        assert start is not None
        first = received[start:start + int(48000 * 0.5)]
        second = received[start + int(48000 * 0.7):start + int(48000 * 1.1)]
        assert band_level(first, 48000, 1000) > 0.03
        assert band_level(second, 48000, 150) < 0.05 * band_level(first, 48000, 1000)

        # The agent's voice reaches the phone at 8 kHz, in the voice band.
        agent.speak_tone(2000, 600)

        def heard_tone() -> bool:
            audio = server.sip_calls()[info.sip_call_id].heard_audio()
            return any(band_level(audio[i:i + 1600], 8000, 2000) > 0.03 for i in range(0, audio.size - 1600, 800))

        await until(heard_tone, 20, "the phone to hear the agent's tone")

        # DTMF both ways.
        await agent.room.local_participant.publish_dtmf(code=5, digit="5")
        await until(lambda: [k.digit for k in server.sip_calls()[info.sip_call_id].keys if k.source == "room"] == ["5"],
                    10, "the phone to get the agent's key")
        await server.phone_press(info.sip_call_id, "9#")
        await until(lambda: agent.keys == ["9", "#"], 10, "the agent to get the phone's keys")

        # A target that refuses the REFER: its status comes back, and the call goes on.
        with pytest.raises(api.SipCallError) as refused:
            await lkapi.sip.transfer_sip_participant(sip_pb.TransferSIPParticipantRequest(
                room_name="out-1", participant_identity="callee", transfer_to="tel:+15557770000"))
        assert refused.value.sip_status_code == 603 and refused.value.code == "permission_denied"
        assert server.sip_calls()[info.sip_call_id].ended_at is None

        # One that takes it: the caller leaves the room, and where it went is recorded.
        response = await lkapi.sip.transfer_sip_participant(sip_pb.TransferSIPParticipantRequest(
            room_name="out-1", participant_identity="callee", transfer_to="tel:+15558880000"))
        assert response.status == sip_pb.SIPTransferStatus.STS_TRANSFER_SUCCESSFUL
        await until(lambda: "callee" not in server.rooms["out-1"].participants, 10, "the caller to leave the room")
        assert [(t.identity, t.to) for t in server.sip_transfers()] == [("callee", "tel:+15558880000")]
        assert server.sip_calls()[info.sip_call_id].ended_by == "transfer"
    finally:
        await lkapi.aclose()
        await agent.leave()


@pytest.mark.parametrize(("answer", "sip_code", "twirp_code"), [
    (Answer.BUSY, 486, "resource_exhausted"),
    (Answer.DECLINE, 603, "permission_denied"),
    (Answer.UNAVAILABLE, 480, "resource_exhausted"),
])
async def test_a_refused_call_is_a_sip_error_and_leaves_the_room(server, answer, sip_code, twirp_code):
    trunk = await server.add_sip_trunk()
    await server.add_phone(NUMBER, Phone(answer=answer, rings_for_s=0.3))
    async with api.LiveKitAPI(server.url, server.api_key, server.api_secret) as lkapi:
        with pytest.raises(api.SipCallError) as failed:
            await lkapi.sip.create_sip_participant(dial("out-2", trunk))
    assert (failed.value.sip_status_code, failed.value.code) == (sip_code, twirp_code)
    call = server.sip_call_to(NUMBER)
    assert call is not None and call.status == "failed" and call.answered_at is None
    await until(lambda: all(p.info.kind != rtc.ParticipantKind.PARTICIPANT_KIND_SIP
                            for r in server.rooms.values() for p in r.participants.values()), 10, "the call to leave")


async def test_ringing_timeout_unknown_trunk_and_grants(server):
    trunk = await server.add_sip_trunk()
    await server.add_phone(NUMBER, Phone(answer=Answer.NO_ANSWER))
    async with api.LiveKitAPI(server.url, server.api_key, server.api_secret) as lkapi:
        started = asyncio.get_running_loop().time()
        # livekit-api allows a dial the ring window plus 2 s; LiveKit's SIP participant joins the room at
        # once, ours over WebRTC first, which a loaded machine can make slower than that: more time.
        with pytest.raises(api.ServerError) as unanswered:
            await lkapi.sip.create_sip_participant(dial("out-3", trunk, ringing_timeout=datetime.timedelta(seconds=1)),
                                                   timeout=25)
        assert unanswered.value.code == "canceled" and not isinstance(unanswered.value, api.SipCallError)
        assert 0.9 <= asyncio.get_running_loop().time() - started < 25  # the 1 s window, not the default 30 s

        with pytest.raises(api.ServerError) as unknown:
            await lkapi.sip.create_sip_participant(dial("out-3", "ST_nosuchtrunk"))
        assert unknown.value.code == "not_found" and "trunk" in unknown.value.message

        with pytest.raises(api.SipCallError) as nobody:
            await lkapi.sip.create_sip_participant(dial("out-3", trunk, number="+15550009999"))
        assert nobody.value.sip_status_code == 404

    # A token without sip.call may not dial; one without room_admin of the room may not transfer.
    no_sip = api.AccessToken(server.api_key, server.api_secret).with_grants(api.VideoGrants(room_admin=True, room="out-3"))
    async with api.LiveKitAPI(server.url, token=no_sip.to_jwt()) as lkapi:
        with pytest.raises(api.ServerError) as denied:
            await lkapi.sip.create_sip_participant(dial("out-3", trunk))
        assert denied.value.code == "unauthenticated"
    sip_only = api.AccessToken(server.api_key, server.api_secret).with_sip_grants(api.SIPGrants(call=True))
    async with api.LiveKitAPI(server.url, token=sip_only.to_jwt()) as lkapi:
        with pytest.raises(api.ServerError) as denied:
            await lkapi.sip.transfer_sip_participant(sip_pb.TransferSIPParticipantRequest(
                room_name="out-3", participant_identity="x", transfer_to="tel:+15558880000"))
        assert denied.value.code == "unauthenticated"
