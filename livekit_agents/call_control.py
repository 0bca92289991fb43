"""Call control in a LiveKit Agents app: the ready-made call-control tools
(``duplex_agent.agent.tools.telephony``) act on the session's linked participant, in the job's
room, through LiveKit's API."""

from __future__ import annotations

from livekit.agents import RunContext, get_job_context

from duplex_agent.agent.tools import telephony
from duplex_agent.agent.tools.call_control import CallControl, CallControlError
from duplex_agent.webrtc.livekit.sip_call_control import SipCallControl


def job_call_control(ctx: RunContext) -> CallControl:
    job = get_job_context()
    room_io = getattr(ctx.session, "room_io", None) or getattr(ctx.session, "_room_io", None)
    caller = getattr(room_io, "linked_participant", None) if room_io is not None else None
    if caller is None:
        raise CallControlError(telephony.NO_CALLER, "there is no caller linked to this session to act on")
    return SipCallControl(job.room, caller, end_call=lambda reason: job.shutdown(reason), room_api=job.api)


telephony.app_call_control = job_call_control
