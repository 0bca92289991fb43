"""LiveKit's SIP service (``livekit.SIP`` over twirp): outbound trunks, CreateSIPParticipant and
TransferSIPParticipant, checked as livekit-server checks them.

- Trunks: ``CreateSIPOutboundTrunk`` and ``ListSIPOutboundTrunk`` need ``sip.admin``; a call on
  a trunk id nobody created is ``not_found`` "requested sip trunk does not exist".
- ``CreateSIPParticipant`` needs ``sip.call``. The call joins the room at once (``dialing``);
  without ``wait_until_answered`` the request returns then, else once the phone answered and
  the DTMF was dialled, or with the SIP refusal or the ringing timeout as LiveKit's error (the
  participant then leaves the room). ``max_call_duration`` counts from the request, as LiveKit's.
- ``TransferSIPParticipant`` needs ``sip.call`` and ``room_admin`` of the room. The participant
  must carry ``sip.callID`` and its call must be answered; a target that refuses the REFER is
  its SIP status as the error, and the call goes on. An accepted transfer rings the target
  (its ``ring_after_s`` and ``rings_for_s``) while the call's audio goes on, as the REFER's final
  NOTIFY waits for the target's answer; then it takes the call out of the room and is recorded
  (``transfers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from livekit import api
from livekit.protocol import sip as sip_pb

from .. import auth
from ..ids import new_sid
from ..twirp import TwirpError, TwirpRouter, permission_denied, require_sip_admin, require_sip_call
from .bridge import SipBridge
from .calling import Outcome, place, sip_error
from .far_end import CallRecord, FarEndCall
from .phones import NOT_FOUND, Phone, PhoneBook, SipStatus, number_of

if TYPE_CHECKING:
    from ..server import ServerCore

log = logging.getLogger(__name__)

Claims = api.access_token.Claims

#: LiveKit's ring window when a request sets none.
DEFAULT_RINGING_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Transfer:
    call_id: str
    room: str
    identity: str
    to: str
    at: float  # monotonic s


class SipService:
    def __init__(self, server: ServerCore) -> None:
        self._server = server
        self.bridge = SipBridge()
        self.phones = PhoneBook()
        self.trunks: dict[str, sip_pb.SIPOutboundTrunkInfo] = {}
        self._calls: dict[str, FarEndCall] = {}  # by call id; touched on the bridge's loop only
        self.transfers: list[Transfer] = []

    def register(self, router: TwirpRouter) -> None:
        router.add("SIP", "CreateSIPOutboundTrunk", sip_pb.CreateSIPOutboundTrunkRequest, self.create_trunk)
        router.add("SIP", "ListSIPOutboundTrunk", sip_pb.ListSIPOutboundTrunkRequest, self.list_trunks)
        router.add("SIP", "CreateSIPParticipant", sip_pb.CreateSIPParticipantRequest, self.create_participant)
        router.add("SIP", "TransferSIPParticipant", sip_pb.TransferSIPParticipantRequest, self.transfer_participant)

    # ---- trunks ----

    def add_trunk(self, numbers: list[str], address: str = "sip.loopback.invalid", name: str = "") -> str:
        trunk = sip_pb.SIPOutboundTrunkInfo(sip_trunk_id=new_sid("ST_"), name=name, address=address, numbers=numbers)
        self.trunks[trunk.sip_trunk_id] = trunk
        return trunk.sip_trunk_id

    async def create_trunk(self, claims: Claims, request: sip_pb.CreateSIPOutboundTrunkRequest) -> sip_pb.SIPOutboundTrunkInfo:
        require_sip_admin(claims)
        if request.trunk.sip_trunk_id:
            raise TwirpError("invalid_argument", "trunk id must not be set")
        trunk_id = self.add_trunk(list(request.trunk.numbers), request.trunk.address or "sip.loopback.invalid",
                                  request.trunk.name)
        return self.trunks[trunk_id]

    async def list_trunks(self, claims: Claims, request: sip_pb.ListSIPOutboundTrunkRequest) -> sip_pb.ListSIPOutboundTrunkResponse:
        require_sip_admin(claims)
        wanted = set(request.trunk_ids)
        return sip_pb.ListSIPOutboundTrunkResponse(
            items=[t for t in self.trunks.values() if not wanted or t.sip_trunk_id in wanted])

    # ---- outbound calls ----

    async def create_participant(self, claims: Claims, request: sip_pb.CreateSIPParticipantRequest) -> sip_pb.SIPParticipantInfo:
        require_sip_call(claims)
        trunk = self.trunks.get(request.sip_trunk_id)
        if trunk is None:
            raise TwirpError("not_found", "requested sip trunk does not exist")
        if not request.room_name:
            raise TwirpError("invalid_argument", "room name must be set")
        if not request.sip_call_to:
            raise TwirpError("invalid_argument", "call-to number must be set")
        call_id = new_sid("SCL_")
        number = number_of(request.sip_call_to)
        identity = request.participant_identity or f"sip_{number}"
        attributes = {
            "sip.callID": call_id,
            "sip.trunkID": trunk.sip_trunk_id,
            "sip.callStatus": "dialing",
            "sip.hostname": trunk.address,
        }
        if not request.hide_phone_number:
            attributes["sip.phoneNumber"] = number
            from_number = request.sip_number or (trunk.numbers[0] if trunk.numbers else "")
            if from_number:
                attributes["sip.trunkPhoneNumber"] = from_number
        attributes.update(request.participant_attributes)
        token = auth.mint_token(self._server.api_key, self._server.api_secret, identity, request.room_name,
                                name=request.participant_name or None, kind="sip", attributes=attributes,
                                metadata=request.participant_metadata or None)
        record = CallRecord(call_id=call_id, number=number, room=request.room_name, identity=identity)
        phone = self.phones.get(request.sip_call_to)
        ringing_s = request.ringing_timeout.ToTimedelta().total_seconds() if request.HasField("ringing_timeout") \
            else DEFAULT_RINGING_TIMEOUT_S
        max_s = request.max_call_duration.ToTimedelta().total_seconds() if request.HasField("max_call_duration") else 0.0
        call = FarEndCall(record, phone, self._server.url, token)
        await self.bridge.call(lambda: self._join(call))
        placing = self.bridge.submit(lambda: self._place(call, ringing_s, request.dtmf, max_s))
        info = sip_pb.SIPParticipantInfo(participant_identity=identity, room_name=request.room_name, sip_call_id=call_id)
        info.participant_id = await self.bridge.call(lambda: self._participant_sid(call))
        if not request.wait_until_answered:
            return info
        outcome = await asyncio.wrap_future(placing)
        if not outcome.answered:
            raise outcome.error()
        return info

    async def _join(self, call: FarEndCall) -> None:
        self._calls[call.record.call_id] = call
        await call.join()

    async def _participant_sid(self, call: FarEndCall) -> str:
        return call.room.local_participant.sid if call.room is not None else ""

    async def _place(self, call: FarEndCall, ringing_s: float, dtmf: str, max_s: float) -> Outcome:
        if max_s > 0:
            asyncio.get_running_loop().call_later(max_s, lambda: asyncio.ensure_future(call.end("max_duration")))
        progress = asyncio.ensure_future(place(call, ringing_s, dtmf))
        ended = asyncio.ensure_future(call.ended.wait())
        await asyncio.wait({progress, ended}, return_when=asyncio.FIRST_COMPLETED)
        if not progress.done():
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            if call.record.answered_at is not None:  # its 200 OK came, then it hung up: an answered call
                return Outcome(True)
            # the room or the agent ended it while it rang: LiveKit sends CANCEL
            return Outcome(False, SipStatus(487, "Request Terminated"))
        ended.cancel()
        outcome = progress.result()
        if not outcome.answered:
            call.record.sip_status = outcome.refusal.code if outcome.refusal else 0
            await call.end("failed", status="failed")
        return outcome

    # ---- transfers ----

    async def transfer_participant(self, claims: Claims, request: sip_pb.TransferSIPParticipantRequest) -> sip_pb.TransferSIPParticipantResponse:
        if not request.room_name:
            raise TwirpError("invalid_argument", "Missing room name")
        if not request.participant_identity:
            raise TwirpError("invalid_argument", "Missing participant identity")
        require_sip_call(claims)
        video = claims.video
        if video is None or not video.room_admin or video.room != request.room_name:
            raise permission_denied()
        room = self._server.rooms.get(request.room_name)
        participant = room.participants.get(request.participant_identity) if room is not None else None
        if participant is None:
            raise TwirpError("not_found", "participant does not exist")
        call_id = participant.info.attributes.get("sip.callID")
        if not call_id:
            raise TwirpError("invalid_argument", "no SIP session associated with participant")
        await self.bridge.call(lambda: self._transfer(call_id, request.transfer_to))
        self.transfers.append(Transfer(call_id, request.room_name, request.participant_identity,
                                       request.transfer_to, time.monotonic()))
        return sip_pb.TransferSIPParticipantResponse(
            transfer_id=new_sid("STR_"), status=sip_pb.SIPTransferStatus.STS_TRANSFER_SUCCESSFUL,
            reason=sip_pb.SIPTransferReason.STR_COMPLETED)

    async def _transfer(self, call_id: str, to: str) -> None:
        call = self._calls.get(call_id)
        if call is None or call.record.ended_at is not None:
            raise TwirpError("not_found", "unknown call")
        if call.record.answered_at is None:
            raise TwirpError("failed_precondition", "can't transfer non established call")
        target = self.phones.get(to)
        if target is None:
            raise sip_error(NOT_FOUND)
        if target.refuses_transfer is not None:
            raise sip_error(target.refuses_transfer)
        # The REFER's outcome comes once the target answers; the call and its audio go on until then.
        await asyncio.sleep(target.ring_after_s + target.rings_for_s)
        if call.record.ended_at is not None:
            raise TwirpError("not_found", "the call ended during the transfer")
        call.record.transferred_to = to
        await call.end("transfer")

    # ---- for tests, on the bridge's loop ----

    def add_phone(self, number: str, phone: Phone) -> None:
        self.phones.add(number, phone)

    def snapshot(self) -> dict[str, CallRecord]:
        def copy(record: CallRecord) -> CallRecord:
            return dataclasses.replace(record, keys=list(record.keys), heard=list(record.heard), said=list(record.said))

        return self.bridge.read(lambda: {cid: copy(c.record) for cid, c in self._calls.items()})

    async def act(self, call_id: str, action: str, argument: object = None) -> None:
        """``say`` (48 kHz audio), ``press`` (digits) or ``hang_up``, as the phone at the far end."""
        async def run() -> None:
            call = self._calls[call_id]
            if action == "say":
                call.say(argument)  # type: ignore[arg-type]
            elif action == "press":
                await call.press(str(argument))
            elif action == "hang_up":
                await call.end("phone")
            else:
                raise ValueError(f"unknown phone action {action!r}")

        await self.bridge.call(run)

    async def aclose(self) -> None:
        async def end_all() -> None:
            await asyncio.gather(*(c.end("shutdown") for c in self._calls.values()), return_exceptions=True)

        await self.bridge.stop(end_all)
