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

from collections.abc import Callable

from livekit.agents import RunContext, function_tool

from duplex_agent.agent.tools.call_control import CallControl, CallControlError
from duplex_agent.agent.tools.context import ToolContext
from duplex_agent.agent.tools.markers import after_heard

instructions = (
    "When the caller has what they need or says goodbye, say a short goodbye, then call end_call. "
    "To hand the caller to a person or another number, tell them you are transferring them, then call "
    "transfer_call. To get through a phone menu, call send_dtmf with the keys to press."
)

NO_CALLER = "no_caller"

#: How a tool finds its call control in a LiveKit Agents app (its ``RunContext`` is no
#: ``ToolContext``): set by ``duplex_agent.livekit_agents`` when it is imported, which acts on the
#: job's room through LiveKit's API. The transports sit above these tools, so they reach down here.
app_call_control: Callable[[RunContext], CallControl] | None = None


def call_control_of(ctx: RunContext) -> CallControl:
    """The call control a tool acts through: the worker's own, or, in a LiveKit Agents app, one for
    the session's linked participant in the job's room."""
    if isinstance(ctx, ToolContext):
        return ctx.control
    if app_call_control is None:
        raise CallControlError(NO_CALLER, "call control in a LiveKit Agents app needs duplex_agent.livekit_agents "
                                          "imported")
    return app_call_control(ctx)


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
