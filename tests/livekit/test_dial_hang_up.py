"""A far end that hangs up while a greeting is being said: the agent's own (``--greeting``), or the
phone's. The job ends cleanly, the reason goes to the log, /metrics and the room's events, and the
worker goes on to serve the next call."""

from __future__ import annotations

from devtools.livekit_server.sip import Phone
from devtools.speech import speak
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.livekit.test_dial_out import RoomEvents, job_ended, job_of_room, metrics
from tests.support.ports import free_port
from tests.support.waits import until

HANGS_UP_ON_AGENT = "+15551230021"
HANGS_UP_ON_ITSELF = "+15551230022"
#: Long enough that it is still being said when the phone hangs up a second after answering,
#: however slowly a loaded machine starts it.
LONG_GREETING = ("Hello, this is the pharmacy calling about your prescription. It is ready to be collected "
                 "at the counter, and we are open every day until eight in the evening.")


async def test_a_far_end_that_hangs_up_during_the_greeting_ends_the_job_with_the_reason(livekit_server,
                                                                                       ready_worker):
    metrics_port = free_port()
    worker = await ready_worker(extra=("--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(HANGS_UP_ON_AGENT, Phone(rings_for_s=0.3, hangs_up_after_s=1.0))
    await livekit_server.add_phone(HANGS_UP_ON_ITSELF, Phone(
        rings_for_s=0.3, hangs_up_after_s=1.0,
        greeting=speak("Good morning, you have reached the office of doctor Smith, how can I help?", 48000)))

    # The agent speaks first; the phone hangs up a second into its greeting.
    observer = RoomEvents()
    await observer.room.connect(livekit_server.url, livekit_server.mint_token("observer", "greeting-call"))
    request = DialRequest(HANGS_UP_ON_AGENT, trunk, agent_speaks_first=True, greeting=LONG_GREETING)
    await livekit_server.create_dispatch("greeting-call", AGENT_NAME, request.to_metadata())
    await until(lambda: job_ended(livekit_server, "greeting-call"), 90, "the hung-up call's job to end")
    call = livekit_server.sip_call_to(HANGS_UP_ON_AGENT)
    assert call.answered_at is not None and call.ended_by == "phone"
    await until(lambda: any(e.get("type") == "error" for e in observer.events), 10, "the room to hear why")
    error = next(e for e in observer.events if e.get("type") == "error")["error"]
    assert error["code"] == "dial_hung_up_during_greeting", error
    await observer.room.disconnect()
    assert f"{HANGS_UP_ON_AGENT} hung up" in worker.log() and "during the agent's greeting" in worker.log()
    job_id = job_of_room(livekit_server, "greeting-call").id
    await until(lambda: f"job {job_id} ends after 1 session" in worker.log(), 30, "the session to end")
    text = await metrics(metrics_port)
    assert 'duplex_dial_outcomes_total{outcome="hung_up_during_greeting"} 1.0' in text, text

    # The next call is served: the phone hangs up in the middle of its own greeting, and that
    # call ends cleanly too.
    await livekit_server.create_dispatch("own-greeting-call", AGENT_NAME,
                                         DialRequest(HANGS_UP_ON_ITSELF, trunk).to_metadata())
    await until(lambda: job_ended(livekit_server, "own-greeting-call"), 90, "the second call's job to end")
    call = livekit_server.sip_call_to(HANGS_UP_ON_ITSELF)
    assert call.answered_at is not None and call.ended_by == "phone"
    job_id = job_of_room(livekit_server, "own-greeting-call").id
    await until(lambda: f"job {job_id} ends after 1 session" in worker.log(), 30, "the second session to end")
    assert worker.log().count("closed (caller_left)") == 2
    # The phone hung up during its own greeting, not the agent's: no greeting of the agent's was cut.
    text = await metrics(metrics_port)
    assert 'duplex_dial_outcomes_total{outcome="hung_up_during_greeting"} 1.0' in text
    assert 'duplex_dial_outcomes_total{outcome="answered"} 2.0' in text
    assert "Traceback" not in worker.log()
