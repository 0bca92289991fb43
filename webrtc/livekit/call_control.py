"""Call control of a LiveKit caller: hang up through the room's API; transfer and DTMF for a phone.

A standard participant can be hung up on (removed from the room through LiveKit's room service
when the worker has its API, else the agent ends its side and serves them no more); transfer and
DTMF need a phone line. A SIP participant has one: ``transfer_sip`` and ``send_sip_dtmf`` are the
two places a telephony setup fills in (through livekit-api's SIP service and the room); here they
say the worker has no phone service set up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from livekit import api, rtc

from duplex_agent.agent.tools.call_control import DTMF_DIGITS, CallControlError

log = logging.getLogger("duplex_agent.livekit")

NEEDS_PHONE_CALL = "needs_phone_call"
NOT_SET_UP = "not_set_up"
HANG_UP_FAILED = "hang_up_failed"
INVALID_DIGITS = "invalid_digits"
#: What the caller's side still holds of the agent's voice once it has left the worker: the
#: network, a receive jitter buffer, a SIP bridge, the carrier and the phone's own buffer. A
#: hang-up or a transfer right after the last word left would cut its end off down the line.
#: A phone call's one-way delay alone may reach ITU-T G.114's 400 ms, and adaptive jitter
#: buffers grow on a jittery mobile or Wi-Fi leg; a little more silence before the line drops
#: costs the caller nothing, a lost last word does.
FAR_END_HOLDS_S = 0.8


class LiveKitCallControl:
    def __init__(self, room: rtc.Room, caller: rtc.RemoteParticipant, *, end_call: Callable[[str], None],
                 room_api: api.LiveKitAPI | None = None,
                 voice_sent: Callable[[], Awaitable[None]] | None = None) -> None:
        self.room = room
        self.caller = caller
        self._end_call = end_call
        self._room_api = room_api
        #: Returns once the agent's voice queued in the room's track has gone out.
        self._voice_sent = voice_sent

    async def let_voice_arrive(self) -> None:
        """Before the caller is taken off the line: what the agent said reaches their ear."""
        if self._voice_sent is not None:
            await self._voice_sent()
        await asyncio.sleep(FAR_END_HOLDS_S)

    @property
    def kind(self) -> str:
        return "sip" if self.caller.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP else "livekit"

    async def hang_up(self, reason: str) -> None:
        await self.let_voice_arrive()
        log.info("the agent hangs up on %s (%s)", self.caller.identity, reason)
        if self._room_api is None:
            self._end_call(reason)
            return
        try:
            await self._room_api.room.remove_participant(
                api.RoomParticipantIdentity(room=self.room.name, identity=self.caller.identity))
        except Exception as exc:  # the server refused or is gone: the agent still ends its side
            log.warning("removing %s from room %s failed: %s", self.caller.identity, self.room.name, exc)
            self._end_call(reason)
            raise CallControlError(HANG_UP_FAILED, "the caller could not be removed from the room; the agent "
                                   "has left the call") from exc

    async def transfer(self, to: str) -> None:
        if self.kind != "sip":
            raise CallControlError(NEEDS_PHONE_CALL, "a transfer needs a phone call; this caller joined the room "
                                   "directly, with no line to transfer")
        await self.let_voice_arrive()
        await self.transfer_sip(to)

    async def send_dtmf(self, digits: str) -> None:
        if not digits or any(digit not in DTMF_DIGITS for digit in digits):
            raise CallControlError(INVALID_DIGITS, f"DTMF digits are {''.join(sorted(DTMF_DIGITS))}, not {digits!r}")
        if self.kind != "sip":
            raise CallControlError(NEEDS_PHONE_CALL, "DTMF needs a phone call; this caller joined the room directly")
        await self.send_sip_dtmf(digits)

    async def transfer_sip(self, to: str) -> None:
        raise CallControlError(NOT_SET_UP, "this worker has no phone service set up to transfer calls")

    async def send_sip_dtmf(self, digits: str) -> None:
        raise CallControlError(NOT_SET_UP, "this worker has no phone service set up to send DTMF")
