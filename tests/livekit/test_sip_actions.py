"""Transfer and DTMF on a phone call through the loopback server's SIP service, as the worker's
call control makes them: the phone gets the keys paced, a refusing target leaves the caller on the
line with the reason, an accepting one takes them out of the room."""

from __future__ import annotations

import asyncio

import pytest
from livekit import api, rtc
from livekit.protocol import sip as sip_pb

from devtools.livekit_server.sip import Phone, SipStatus
from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.livekit.sip_actions import KEY_TONE_S, send_paced_dtmf, transfer_sip_participant
from tests.support.waits import until

NUMBER = "+15551230001"


async def test_paced_dtmf_and_transfers_on_a_phone_call(livekit_server):
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(NUMBER, Phone(rings_for_s=0.3))
    await livekit_server.add_phone("+15557770000", Phone(refuses_transfer=SipStatus(486, "Busy Here")))
    await livekit_server.add_phone("+15558880000", Phone())
    agent = rtc.Room()
    await agent.connect(livekit_server.url, livekit_server.mint_token("agent", "call", kind="agent", agent=True))
    FfiRouter.shared().own_room(agent)
    lkapi = api.LiveKitAPI(livekit_server.url, livekit_server.api_key, livekit_server.api_secret)
    try:
        info = await lkapi.sip.create_sip_participant(sip_pb.CreateSIPParticipantRequest(
            sip_trunk_id=trunk, sip_call_to=NUMBER, room_name="call", wait_until_answered=True))

        await send_paced_dtmf(agent.local_participant, "4#7")

        def keys():
            return [k for k in livekit_server.sip_calls()[info.sip_call_id].keys if k.source == "room"]

        await until(lambda: len(keys()) == 3, 10, "the phone to get the keys")
        assert [k.digit for k in keys()] == ["4", "#", "7"]
        gaps = [b.at - a.at for a, b in zip(keys(), keys()[1:])]
        assert all(gap >= 1.5 * KEY_TONE_S for gap in gaps), gaps

        with pytest.raises(CallControlError) as refused:
            await transfer_sip_participant(lkapi, "call", info.participant_identity, "+15557770000")
        assert refused.value.code == "transfer_refused" and "486" in str(refused.value)
        assert info.participant_identity in livekit_server.rooms["call"].participants

        await transfer_sip_participant(lkapi, "call", info.participant_identity, "+15558880000")
        await until(lambda: info.participant_identity not in livekit_server.rooms["call"].participants, 10,
                    "the caller to leave the room")
        assert [t.to for t in livekit_server.sip_transfers()] == ["tel:+15558880000"]
    finally:
        await lkapi.aclose()
        await asyncio.wait_for(agent.disconnect(), 10)
