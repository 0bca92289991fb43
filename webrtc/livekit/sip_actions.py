"""What only a phone call can do, through LiveKit: a cold transfer (livekit-api's
TransferSIPParticipant, a SIP REFER to the carrier) and DTMF down the line (the room's
``publish_dtmf``, which LiveKit's SIP bridge plays as RFC 4733 telephone events).

These are the phone-line half of a LiveKit caller's call control: each failure is a
``CallControlError`` whose sentence the model can be told, and the call goes on.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import aiohttp
from livekit import api, rtc
from livekit.protocol import sip as sip_pb

from duplex_agent.agent.tools.call_control import DTMF_DIGITS, CallControlError

INVALID_TARGET = "invalid_target"
TRANSFER_REFUSED = "transfer_refused"
TRANSFER_FAILED = "transfer_failed"
INVALID_DIGITS = "invalid_digits"

#: RFC 4733 telephone-event codes, as LiveKit's SIP DTMF packets carry them.
DTMF_CODES = {**{str(d): d for d in range(10)}, "*": 10, "#": 11, "A": 12, "B": 13, "C": 14, "D": 15}
#: How long each key lasts on the line, and the quiet before the next. RFC 4733 leaves durations
#: to the sender; exchanges and phone menus expect a tone of at least 40 ms and a gap of at least
#: 40 ms (ITU-T Q.24), and ones sent much faster than a person presses are often missed. LiveKit's
#: bridge plays each packet as one event as it comes, so the pacing is the sender's.
KEY_TONE_S = 0.1
KEY_GAP_S = 0.1
_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")


def transfer_target(to: str) -> str:
    """``to`` as LiveKit's transfer takes it: ``tel:+E164`` or a ``sip:``/``sips:`` URI; a bare
    E.164 number becomes ``tel:``. CallControlError for anything else."""
    target = to.strip()
    if _E164.match(target):
        return f"tel:{target}"
    if target.startswith("tel:") and _E164.match(target[4:]):
        return target
    if re.match(r"^sips?:[^@\s]+@[^\s]+$", target):
        return target
    raise CallControlError(INVALID_TARGET, f"{to!r} is not a number to transfer to: give an E.164 number "
                                           "such as +15551234567, or a sip: address")


async def transfer_sip_participant(lkapi: api.LiveKitAPI, room: str, identity: str, to: str) -> None:
    """Cold-transfer ``identity``'s call in ``room`` to ``to``; once it returns the caller has left
    the room. A target that refuses (its SIP status), or a transfer LiveKit cannot make, raises
    CallControlError and the caller stays."""
    target = transfer_target(to)
    request = sip_pb.TransferSIPParticipantRequest(room_name=room, participant_identity=identity, transfer_to=target)
    try:
        response = await lkapi.sip.transfer_sip_participant(request)
    except api.SipCallError as exc:
        status = f"{exc.sip_status_code} {exc.sip_status or ''}".strip() if exc.sip_status_code else \
            (exc.sip_transfer_reason or exc.message)
        raise CallControlError(TRANSFER_REFUSED, f"the transfer to {target} was refused ({status}); the caller "
                                                 "is still on the line") from None
    except api.ServerError as exc:
        raise CallControlError(TRANSFER_FAILED, f"the transfer to {target} could not be made ({exc.code}: "
                                                f"{exc.message}); the caller is still on the line") from None
    except (aiohttp.ClientError, TimeoutError):
        raise CallControlError(TRANSFER_FAILED, f"the transfer to {target} could not be made (LiveKit did not "
                                                "answer); the caller is still on the line") from None
    if response.status == sip_pb.SIPTransferStatus.STS_TRANSFER_FAILED:
        reason = sip_pb.SIPTransferReason.Name(response.reason)
        raise CallControlError(TRANSFER_REFUSED, f"the transfer to {target} failed ({reason}); the caller is "
                                                 "still on the line")


def check_digits(digits: str) -> str:
    if not digits or any(digit not in DTMF_DIGITS for digit in digits):
        raise CallControlError(INVALID_DIGITS, f"DTMF keys are 0-9, *, # and A-D, not {digits!r}")
    return digits


async def send_paced_dtmf(participant: rtc.LocalParticipant, digits: str, *,
                          sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """Send ``digits`` down the caller's line, one key every ``KEY_TONE_S + KEY_GAP_S``."""
    for index, digit in enumerate(check_digits(digits)):
        if index:
            await sleep(KEY_TONE_S + KEY_GAP_S)
        await participant.publish_dtmf(code=DTMF_CODES[digit], digit=digit)
