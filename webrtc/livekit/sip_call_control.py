"""Call control of a LiveKit caller with its phone half filled in: a SIP participant can be
transferred (TransferSIPParticipant) and sent DTMF (the room's ``publish_dtmf``, paced), through
``sip_actions``; hang-up and the rest are ``LiveKitCallControl``'s."""

from __future__ import annotations

from duplex_agent.webrtc.livekit.call_control import LiveKitCallControl
from duplex_agent.webrtc.livekit.sip_actions import send_paced_dtmf, transfer_sip_participant


class SipCallControl(LiveKitCallControl):
    async def transfer_sip(self, to: str) -> None:
        if self._room_api is None:  # no server API: the base says the worker has no phone service
            await super().transfer_sip(to)
            return
        await transfer_sip_participant(self._room_api, self.room.name, self.caller.identity, to)

    async def send_sip_dtmf(self, digits: str) -> None:
        await send_paced_dtmf(self.room.local_participant, digits)
