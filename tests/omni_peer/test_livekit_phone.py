"""A dialled phone call served by the real vLLM-Omni 0.30.0, with the call-control tools: the
worker (``duplex-agent start --backend``) dials a phone through the loopback server's SIP
service, the peer's scripted model answers the phone's greeting by calling ``end_call``
(its session's first tool) through vLLM-Omni's own function-call path, and the worker hangs up
once the phone has heard what the model said with it."""

from __future__ import annotations

import numpy as np
import pytest

from devtools.livekit_server.sip import Phone
from devtools.speech import speak
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import (  # noqa: F401 (fixtures)
    AGENT_NAME,
    livekit_server,
    processes,
    ready_worker,
    start_worker,
)
from tests.livekit.test_dial_out import job_ended, metrics
from tests.support.ports import free_port
from tests.support.waits import until

NUMBER = "+15551230041"
LOUD_RMS = 0.02


def loud_s(call) -> float:
    """Seconds of loud 10 ms frames the phone heard before its call ended."""
    parts = [h.samples for h in call.heard if h.at <= call.ended_at]
    if not parts:
        return 0.0
    audio = np.concatenate(parts)
    step = call.rate // 100
    frames = audio[: audio.size - audio.size % step].reshape(-1, step)
    return float(np.sum(np.sqrt(np.mean(frames ** 2, axis=1)) > LOUD_RMS)) / 100


@pytest.fixture(scope="module")
def peer(started):
    return started.peer(tools=True, max_sessions=4)


async def test_a_dialled_phone_is_hung_up_on_after_hearing_the_models_goodbye(peer, livekit_server,  # noqa: F811
                                                                               ready_worker):  # noqa: F811
    metrics_port = free_port()
    worker = await ready_worker(backend=peer.realtime_url, extra=(
        "--tools", "duplex_agent.agent.tools.telephony", "--backend-tools", "yes",
        "--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(NUMBER, Phone(rings_for_s=0.5, greeting=speak("Hello, who is calling?", 48000,
                                                                                  before_ms=300, after_ms=800)))
    await livekit_server.create_dispatch("omni-call", AGENT_NAME, DialRequest(NUMBER, trunk).to_metadata())
    try:
        await until(lambda: livekit_server.sip_call_to(NUMBER) is not None
                    and livekit_server.sip_call_to(NUMBER).ended_at is not None, 120, "the agent to hang up")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from None
    call = livekit_server.sip_call_to(NUMBER)
    assert call.ended_by == "room"
    # what the model said beside its call (its scripted voice: a 0.24 s tone) was heard whole before the hang-up
    assert loud_s(call) >= 0.2, f"the phone heard {loud_s(call):.2f} s of the agent before it hung up"
    await until(lambda: job_ended(livekit_server, "omni-call"), 30, "the call's job to end")
    text = await metrics(metrics_port)
    assert 'duplex_tool_calls_total{tool="end_call"}' in text, "the hang-up was not the model's end_call"
    assert 'duplex_dial_outcomes_total{outcome="answered"} 1.0' in text
    assert "Traceback" not in worker.log()
