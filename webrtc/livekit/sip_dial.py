"""Placing an outbound call through LiveKit's SIP service (livekit-api's CreateSIPParticipant).

The request waits until the far end answers (``wait_until_answered``): LiveKit puts the
called party in the room while it dials, so whoever serves the room hears the first "Hello?",
and the request returns once the phone is answered and the DTMF dialled. Every way it can
fail becomes a ``DialFailed`` with its reason; nothing else escapes.
"""

from __future__ import annotations

import datetime

import aiohttp
from livekit import api
from livekit.protocol import sip as sip_pb

from duplex_agent.agent.telephony.dial_outcome import DialFailed, reason_of_sip_status
from duplex_agent.agent.telephony.dial_request import DialRequest


def create_request(room: str, request: DialRequest) -> sip_pb.CreateSIPParticipantRequest:
    create = sip_pb.CreateSIPParticipantRequest(
        sip_trunk_id=request.trunk, sip_call_to=request.number, room_name=room,
        participant_identity=request.participant_identity, participant_name=request.number,
        sip_number=request.caller_id, dtmf=request.dtmf, wait_until_answered=True,
    )
    create.ringing_timeout.FromTimedelta(datetime.timedelta(seconds=request.ringing_timeout_s))
    if request.max_duration_s > 0:
        create.max_call_duration.FromTimedelta(datetime.timedelta(seconds=request.max_duration_s))
    return create


async def place_call(lkapi: api.LiveKitAPI, room: str, request: DialRequest) -> sip_pb.SIPParticipantInfo:
    """Dial ``request`` into ``room``; returns once answered, else raises ``DialFailed``."""
    try:
        return await lkapi.sip.create_sip_participant(create_request(room, request))
    except api.SipCallError as exc:
        code = exc.sip_status_code
        status = f"SIP {code} {exc.sip_status or ''}".strip() if code else exc.message
        reason = reason_of_sip_status(code) if code else "failed"
        raise DialFailed(reason, f"the call to {request.number} was not answered: {reason} ({status})",
                         sip_status=code) from None
    except api.ServerError as exc:
        raise _server_refusal(exc, request) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DialFailed("failed", f"LiveKit could not be reached to call {request.number}: {exc or type(exc).__name__}") from None


def _server_refusal(exc: api.ServerError, request: DialRequest) -> DialFailed:
    if exc.code in ("canceled", "deadline_exceeded"):  # LiveKit's ringing timeout: no SIP status
        return DialFailed("no_answer", f"{request.number} rang for {request.ringing_timeout_s:g} s without an answer")
    if exc.code == "not_found" and "trunk" in exc.message:
        return DialFailed("unknown_trunk", f"LiveKit has no outbound trunk {request.trunk!r}")
    if exc.code in ("unauthenticated", "permission_denied"):
        return DialFailed("not_permitted", f"LiveKit refused to call {request.number} ({exc.message}): "
                                           "the API key needs the SIP call grant")
    return DialFailed("failed", f"LiveKit could not call {request.number}: {exc.code}: {exc.message}")
