"""Call-control tools: end the call, transfer it, press phone keys.

Give them to the worker with ``--tools duplex_agent.agent.tools.telephony`` (or import them into
your own tool module), or put them on a LiveKit Agents app's ``Agent(tools=[...])``. In the worker
they act through the call's own ``CallControl``; in a LiveKit Agents app, through the job's room
and LiveKit's API (``SipCallControl`` for the session's linked participant).

``end_call`` and ``transfer_call`` are after-heard: they run once the caller has heard what the
agent said before them ("Goodbye!", "I'll put you through now"), and not at all if the caller
talked over it. A transfer the target refuses comes back to the model as the tool's error, and
the call goes on.
"""

from __future__ import annotations

from livekit.agents import RunContext, function_tool, get_job_context

from duplex_agent.agent.tools.call_control import CallControl, CallControlError
from duplex_agent.agent.tools.context import ToolContext
from duplex_agent.agent.tools.markers import after_heard

instructions = (
    "When the caller has what they need or says goodbye, say a short goodbye, then call end_call. "
    "To hand the caller to a person or another number, tell them you are transferring them, then call "
    "transfer_call. To get through a phone menu, call send_dtmf with the keys to press."
)

NO_CALLER = "no_caller"


def call_control_of(ctx: RunContext) -> CallControl:
    """The call control a tool acts through: the worker's own, or, in a LiveKit Agents app, one for
    the session's linked participant in the job's room."""
    if isinstance(ctx, ToolContext):
        return ctx.control
    from duplex_agent.webrtc.livekit.sip_call_control import SipCallControl

    job = get_job_context()
    room_io = getattr(ctx.session, "room_io", None) or getattr(ctx.session, "_room_io", None)
    caller = getattr(room_io, "linked_participant", None) if room_io is not None else None
    if caller is None:
        raise CallControlError(NO_CALLER, "there is no caller linked to this session to act on")
    return SipCallControl(job.room, caller, end_call=lambda reason: job.shutdown(reason), room_api=job.api)


@after_heard
@function_tool
async def end_call(ctx: RunContext) -> str:
    """End the call. Say goodbye first: the call ends once the caller has heard it."""
    await call_control_of(ctx).hang_up("the agent ended the call")
    return "the call has ended"


@after_heard
@function_tool
async def transfer_call(ctx: RunContext, to: str) -> str:
    """Transfer the caller to another phone number or SIP address. Tell them first that you are
    transferring them: the transfer is made once they have heard it.

    Args:
        to: the number to transfer to, in E.164 form such as +15551234567, or a sip: address
    """
    await call_control_of(ctx).transfer(to)
    return f"the caller was transferred to {to}"


@function_tool
async def send_dtmf(ctx: RunContext, digits: str) -> str:
    """Press keys on the phone line, e.g. to choose an option in a phone menu.

    Args:
        digits: the keys to press, in order: 0-9, *, # and A-D
    """
    await call_control_of(ctx).send_dtmf(digits)
    return f"pressed {digits}"
