"""Call progress of an outbound call: the INVITE rings the phone, which answers or refuses,
or rings until the ringing timeout; an answered call dials the request's DTMF before it is
``active``. A SIP refusal becomes the twirp error LiveKit sends (its code from the SIP
status as livekit-protocol maps it, the status in ``meta``); a ringing timeout is LiveKit's
``canceled`` "sip request timed out", with no SIP status.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..twirp import TwirpError
from .far_end import FarEndCall
from .phones import NOT_FOUND, REFUSALS, Answer, SipStatus

#: The twirp code livekit-protocol gives the SIP statuses a phone here can answer with.
_TWIRP_CODE = {404: "not_found", 408: "deadline_exceeded", 480: "resource_exhausted", 486: "resource_exhausted",
               487: "aborted", 600: "resource_exhausted", 603: "permission_denied"}


def sip_error(status: SipStatus) -> TwirpError:
    code = _TWIRP_CODE.get(status.code)
    if code is None:
        code = "failed_precondition" if 500 <= status.code < 600 else "invalid_argument"
    return TwirpError(code, f"sip status {status.code}: {status.status}",
                      {"sip_status_code": str(status.code), "sip_status": status.status})


def ringing_timed_out() -> TwirpError:
    return TwirpError("canceled", "sip request timed out")


@dataclass(frozen=True)
class Outcome:
    answered: bool
    refusal: SipStatus | None = None  # None and not answered: the ringing timeout

    def error(self) -> TwirpError:
        return sip_error(self.refusal) if self.refusal is not None else ringing_timed_out()


async def place(call: FarEndCall, ringing_timeout_s: float, dtmf: str) -> Outcome:
    """Ring ``call``'s phone; on an answer, dial ``dtmf`` and make the call active."""
    phone = call.phone
    if phone is None:
        return Outcome(False, NOT_FOUND)
    await asyncio.sleep(phone.ring_after_s)
    await call.set_status("ringing")
    rings_until = asyncio.get_running_loop().time() + ringing_timeout_s - phone.ring_after_s
    if phone.answer is Answer.NO_ANSWER or phone.rings_for_s > ringing_timeout_s - phone.ring_after_s:
        await asyncio.sleep(max(0.0, rings_until - asyncio.get_running_loop().time()))
        return Outcome(False)
    await asyncio.sleep(phone.rings_for_s)
    if phone.answer is not Answer.ANSWER:
        return Outcome(False, REFUSALS[phone.answer])
    call.record.answered_at = time.monotonic()
    call.record.sip_status = 200
    if phone.hangs_up_after_s is not None:
        asyncio.get_running_loop().call_later(phone.hangs_up_after_s, lambda: asyncio.ensure_future(call.end("phone")))
    if dtmf:
        await call.set_status("automation")
        await call.dial_keys(dtmf)
    await call.set_status("active")
    if phone.greeting is not None:
        call.say(phone.greeting)
    return Outcome(True)
