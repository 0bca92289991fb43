"""The call-control tools as the worker loads them: their schemas, which wait until the caller has
heard the agent, and what each asks of the call's control; a refusal reaches the model."""

from __future__ import annotations

import pytest
from livekit.agents import llm

from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.agent.tools.context import ToolContext
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.markers import is_after_heard
from duplex_agent.agent.tools.telephony import end_call, send_dtmf, transfer_call


class Control:
    kind = "sip"

    def __init__(self, refuse: CallControlError | None = None) -> None:
        self.done: list[tuple[str, str]] = []
        self._refuse = refuse

    async def hang_up(self, reason: str) -> None:
        self.done.append(("hang_up", reason))

    async def transfer(self, to: str) -> None:
        if self._refuse is not None:
            raise self._refuse
        self.done.append(("transfer", to))

    async def send_dtmf(self, digits: str) -> None:
        self.done.append(("send_dtmf", digits))


def context(control: Control) -> ToolContext:
    async def heard() -> bool:
        return True

    return ToolContext(CallInfo(None, "sip_+15551230001", control),
                       llm.FunctionCall(call_id="c1", name="tool", arguments="{}"), heard)


def test_the_module_loads_with_its_instructions_and_schemas():
    module = load_tool_module("duplex_agent.agent.tools.telephony")
    schemas = {schema["name"]: schema["parameters"] for schema in module.schemas}
    assert set(schemas) == {"end_call", "transfer_call", "send_dtmf"}
    assert not schemas["end_call"]["properties"]  # the context is no argument of the model's
    assert schemas["transfer_call"]["required"] == ["to"] and schemas["send_dtmf"]["required"] == ["digits"]
    assert "end_call" in module.instructions and "transfer_call" in module.instructions
    assert is_after_heard(end_call) and is_after_heard(transfer_call) and not is_after_heard(send_dtmf)


async def test_each_tool_acts_through_the_calls_control():
    control = Control()
    assert await end_call(context(control)) == "the call has ended"
    assert await transfer_call(context(control), "+15558880000") == "the caller was transferred to +15558880000"
    assert await send_dtmf(context(control), "12#") == "pressed 12#"
    assert control.done == [("hang_up", "the agent ended the call"), ("transfer", "+15558880000"),
                            ("send_dtmf", "12#")]


async def test_a_refused_transfer_reaches_the_model_as_the_controls_error():
    refusal = CallControlError("transfer_refused", "the transfer to tel:+15557770000 was refused (603 Decline)")
    with pytest.raises(CallControlError) as refused:
        await transfer_call(context(Control(refusal)), "+15557770000")
    assert refused.value is refusal


def test_in_a_livekit_agents_app_the_tools_act_through_the_jobs_room():
    from duplex_agent.agent.tools import telephony
    from duplex_agent.livekit_agents.call_control import job_call_control

    assert telephony.app_call_control is job_call_control
