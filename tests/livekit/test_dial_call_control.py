"""Call control on an outbound phone call, end to end: the real worker process dials a phone
through the loopback server's SIP service, the reference model (``--responder openai`` against the
tool-calling chat stub) calls the ready-made ``transfer_call`` and ``end_call`` tools, and the
phone's own record says what it heard and when it was transferred or hung up on."""

from __future__ import annotations

from devtools.livekit_server.sip import Phone
from devtools.speech import speak
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.livekit.test_dial_out import job_ended, metrics
from tests.support.chat_stub import GOODBYE, TRANSFER_ANNOUNCEMENT, start_server, tool_calling_reply
from tests.support.heard import heard_to_the_end, phone_heard, replied_and_quiet
from tests.support.ports import free_port
from tests.support.waits import until

ASKS_FOR_A_PERSON = "+15551230011"
DONE = "+15551230012"
DESK = "+15558880000"


def asked_of_model(seen: list[dict]) -> list[str]:
    return [str(body["messages"][-1].get("content")) for body in seen if body["messages"]]


async def test_the_agent_transfers_a_caller_who_asks_for_a_person_and_hangs_up_after_goodbye(livekit_server,
                                                                                             ready_worker):
    seen: list[dict] = []
    chat, base_url = await start_server(tool_calling_reply(seen, transfer_to=DESK))
    try:
        metrics_port = free_port()
        worker = await ready_worker(extra=("--tools", "duplex_agent.agent.tools.telephony", "--responder", "openai",
                                           "--openai-base-url", base_url, "--openai-model", "stub",
                                           "--metrics-port", str(metrics_port)))
        trunk = await livekit_server.add_sip_trunk()
        await livekit_server.add_phone(ASKS_FOR_A_PERSON, Phone(
            rings_for_s=0.5, greeting=speak("Hello, can I speak to a person?", 48000, before_ms=300)))
        await livekit_server.add_phone(DESK, Phone())
        await livekit_server.add_phone(DONE, Phone(rings_for_s=0.5, greeting=speak("Hello?", 48000, before_ms=300)))

        # Asked for a person, the agent says it will transfer, and the phone goes to the desk once
        # the announcement's last word was down the line.
        await livekit_server.create_dispatch("transfer-call", AGENT_NAME,
                                             DialRequest(ASKS_FOR_A_PERSON, trunk).to_metadata())
        try:
            await until(lambda: livekit_server.sip_transfers(), 120, "the call to be transferred")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the model was asked: {asked_of_model(seen)}") from None
        transfer = livekit_server.sip_transfers()[0]
        assert transfer.to == f"tel:{DESK}"
        call = livekit_server.sip_call_to(ASKS_FOR_A_PERSON)
        assert call.ended_by == "transfer" and call.transferred_to == transfer.to
        announced = phone_heard(call, until=transfer.at)
        assert heard_to_the_end(announced, TRANSFER_ANNOUNCEMENT), f"the announcement was not all heard: {announced}"
        await until(lambda: job_ended(livekit_server, "transfer-call"), 30, "the transferred call's job to end")

        # A goodbye, heard whole, then the agent hangs up. The caller says more than "That's all,
        # thanks.": on the phone line Silero scores that short phrase near the phone threshold, so
        # whether it starts a turn depends on where the 32 ms windows fall on it.
        asked_before = len(seen)
        await livekit_server.create_dispatch("done-call", AGENT_NAME, DialRequest(DONE, trunk).to_metadata())
        await until(lambda: len(seen) > asked_before and replied_and_quiet(livekit_server.sip_call_to(DONE)), 120,
                    "the agent's answer to the phone's hello, played out")
        call = livekit_server.sip_call_to(DONE)
        asked = call.heard[-1].at
        await livekit_server.phone_say(call.call_id, speak("That's all, thank you. Goodbye.", 48000, after_ms=500))
        try:
            await until(lambda: livekit_server.sip_call_to(DONE).ended_at is not None, 120, "the agent to hang up")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the model was asked: {asked_of_model(seen)}") from None
        call = livekit_server.sip_call_to(DONE)
        assert call.ended_by == "room"
        goodbye = phone_heard(call, since=asked)
        assert heard_to_the_end(goodbye, GOODBYE), f"the goodbye was not all heard: {goodbye}"
        await until(lambda: job_ended(livekit_server, "done-call"), 30, "the hung-up call's job to end")

        # The transfer and the hang-up were the model's tool calls, run by the worker's edge.
        text = await metrics(metrics_port)
        for tool in ("transfer_call", "end_call"):
            assert f'duplex_tool_calls_total{{tool="{tool}"}}' in text, f"no {tool} call was run"
        assert "Traceback" not in worker.log()
    finally:
        await chat.cleanup()
