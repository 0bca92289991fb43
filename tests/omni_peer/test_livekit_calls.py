"""LiveKit calls served by the real vLLM-Omni 0.30.0 with tools: the worker (``duplex-agent start
--backend --tools``) runs the tools at its edge for the peer's scripted model, which calls them
through vLLM-Omni's own function-call path.

The peer's plugin (Qwen3-Omni's) is turn-based: it answers a tool output on the caller's next
turn. vLLM-Omni ends the spoken response of the turn that calls without its audio (the scripted
stages make it: devtools/omni_peer/scripted_stages.py), so the caller hears the worker's hold
sound there. The scripted voice speaks words as tones: what a reply
said is its ``lk.transcription``, what was heard is its sound.
"""

from __future__ import annotations

import numpy as np
import pytest

from devtools.livekit_server.sip import Phone
from devtools.speech import speak
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import (  # noqa: F401 (fixtures)
    AGENT_NAME,
    livekit_server,
    processes,
    ready_worker,
    start_worker,
)
from tests.livekit.test_dial_out import job_ended, metrics
from tests.omni_peer.caller import reply_tone_hz
from tests.support.ports import free_port
from tests.support.waits import until

#: The scripted model's city: get_weather's schema has no example, so a string is "scripted".
ANSWER = "it is sunny and 21 degrees in scripted"
NUMBER = "+15551230041"
LOUD_RMS = 0.02


def tone_s(frames: list[np.ndarray], hz: float, window_s: float = 0.1) -> float:
    """Seconds of loud ``window_s`` windows of these 48 kHz frames whose strongest frequency is
    ``hz`` (to the window's resolution: the hold sound's A4 is 10 Hz from the second reply's tone)."""
    audio = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    size = int(48000 * window_s)
    windows = audio[: audio.size - audio.size % size].reshape(-1, size)
    freqs = np.fft.rfftfreq(size, 1 / 48000)
    at_hz = [abs(freqs[int(np.argmax(np.abs(np.fft.rfft(w * np.hanning(size)))))] - hz) < 1 / window_s / 2
             for w in windows if float(np.sqrt(np.mean(w ** 2))) > LOUD_RMS]
    return window_s * sum(at_hz)


@pytest.fixture(scope="module")
def peer(omni_peers):
    return omni_peers(tools=True)


async def test_a_livekit_caller_hears_the_answer_of_a_tool_the_model_called(peer, livekit_server,  # noqa: F811
                                                                            ready_worker):  # noqa: F811
    metrics_port = free_port()
    worker = await ready_worker(backend=peer.realtime_url, extra=(
        "--tools", "tests.tools.weather_tools", "--backend-tools", "yes", "--metrics-port", str(metrics_port)))

    async def tool_ran() -> bool:
        return 'duplex_tool_calls_total{tool="get_weather"}' in await metrics(metrics_port)

    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token("alice", "omni-weather"))
    await caller.join()
    try:
        await livekit_server.create_dispatch("omni-weather", AGENT_NAME)
        await until(lambda: "listening" in caller.agent_states, 60, "the agent")
        caller.mic.say(speak("What's the weather in Paris?", 48000, before_ms=300, after_ms=1200))
        await until(tool_ran, 90, "the worker to run the tool the model called", every=0.25)
        await until(lambda: not caller.mic.busy, 30, "the question to be said")
        heard_from = len(caller.received)
        answered = await caller.say_and_listen("Thank you, and what else?", timeout=90)
        assert ANSWER in answered.transcript.lower().rstrip("."), answered
        # its words' tones reached the caller: "reply N ..." speaks at reply N's pitch (the hold
        # sound that played while the answer was awaited is at others)
        index = int(answered.transcript.split()[1])
        assert tone_s(caller.received[heard_from:], reply_tone_hz(index)) >= 0.5, answered
    finally:
        await caller.leave()
    assert "Traceback" not in worker.log()


#: A dialled phone: the model answers the phone's greeting by calling ``end_call`` (the session's
#: first tool). There is no goodbye to wait for here; the goodbye heard whole before the hang-up is
#: tests/livekit/test_dial_call_control.py's.
async def test_a_dialled_phone_is_hung_up_on_by_the_models_end_call(peer, livekit_server,  # noqa: F811
                                                                    ready_worker):  # noqa: F811
    metrics_port = free_port()
    worker = await ready_worker(backend=peer.realtime_url, extra=(
        "--tools", "duplex_agent.agent.tools.telephony", "--backend-tools", "yes",
        "--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    # one breath: a greeting with a pause in it can end the turn early, and the end_call the model
    # then makes is talked over by the greeting's rest (an after-heard tool is then never made)
    greeting = speak("Who is calling?", 48000, before_ms=300, after_ms=800)
    await livekit_server.add_phone(NUMBER, Phone(rings_for_s=0.5, greeting=greeting))
    await livekit_server.create_dispatch("omni-call", AGENT_NAME, DialRequest(NUMBER, trunk).to_metadata())
    try:
        await until(lambda: livekit_server.sip_call_to(NUMBER) is not None
                    and livekit_server.sip_call_to(NUMBER).ended_at is not None, 120, "the agent to hang up")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from None
    call = livekit_server.sip_call_to(NUMBER)
    assert call.ended_by == "room"
    # the model called once it had the greeting: the phone had said it all before the hang-up
    assert call.ended_at - call.answered_at > greeting.size / 48000, (call.answered_at, call.ended_at)
    await until(lambda: job_ended(livekit_server, "omni-call"), 30, "the call's job to end")
    text = await metrics(metrics_port)
    assert 'duplex_tool_calls_total{tool="end_call"}' in text, "the hang-up was not the model's end_call"
    assert 'duplex_dial_outcomes_total{outcome="answered"} 1.0' in text
    assert "Traceback" not in worker.log()
