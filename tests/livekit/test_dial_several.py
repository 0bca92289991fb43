"""Several outbound calls at once, as a deployed worker places them: one worker on a remote
backend (``--backend``, a ``serve`` process) dials three phones together. Each phone that answers
is served its own conversation down its own line, a busy one ends with its reason, and one phone
hanging up mid-call leaves the other call going."""

from __future__ import annotations

import asyncio

import numpy as np

from devtools.livekit_server.sip import Answer, Phone
from devtools.speech import speak, transcribe, words
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.livekit.test_dial_out import job_ended, metrics
from tests.support.ports import free_port
from tests.support.waits import until

MARIA = "+15551230031"
TOM = "+15551230032"
BUSY = "+15551230033"


def heard_since(server, number: str, since: float = 0.0) -> list[str]:
    """The words the phone at ``number`` heard down its line since ``since`` (monotonic s)."""
    audio = server.sip_call_to(number).heard_audio(since)
    if not (audio.size and float(np.abs(audio).max()) > 0.05):
        return []
    return words(transcribe(audio, 8000))


async def test_three_calls_at_once_through_a_remote_backend_each_served_on_its_own_line(
        livekit_server, start_serve, ready_worker):
    backend = await start_serve(plugin="reference", max_sessions=4)
    metrics_port = free_port()
    worker = await ready_worker(backend=backend.realtime_url, max_sessions=3,
                                extra=("--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(MARIA, Phone(rings_for_s=0.5, greeting=speak("Good morning, Maria speaking.", 48000)))
    await livekit_server.add_phone(TOM, Phone(rings_for_s=0.8, greeting=speak("Hello, Tom speaking.", 48000)))
    await livekit_server.add_phone(BUSY, Phone(answer=Answer.BUSY, rings_for_s=0.5))

    rooms = {MARIA: "call-maria", TOM: "call-tom", BUSY: "call-busy"}
    await asyncio.gather(*(livekit_server.create_dispatch(room, AGENT_NAME, DialRequest(number, trunk).to_metadata())
                           for number, room in rooms.items()))
    await until(lambda: job_ended(livekit_server, rooms[BUSY]), 60, "the busy call's job to end")

    # Each answered phone hears the agent answer its own greeting, not the other's.
    heard: dict[str, list[str]] = {}

    def answered(number: str, own: str, other: str) -> bool:
        call = livekit_server.sip_call_to(number)
        if call is None or call.status != "active":
            return False
        heard[number] = heard_since(livekit_server, number)
        assert other not in heard[number], f"{number} heard the other call: {heard[number]}"
        return {"said", own} <= set(heard[number])

    try:
        await until(lambda: answered(MARIA, "maria", "tom") and answered(TOM, "tom", "maria"), 120,
                    "both phones to hear the agent answer their greeting")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; heard {heard}\n{worker.log()[-3000:]}") from None

    # Maria hangs up; Tom's call goes on and is answered again.
    await livekit_server.phone_hang_up(livekit_server.sip_call_to(MARIA).call_id)
    await until(lambda: job_ended(livekit_server, rooms[MARIA]), 30, "Maria's job to end")
    tom = livekit_server.sip_call_to(TOM)
    asked_at = tom.heard[-1].at
    await livekit_server.phone_say(tom.call_id, speak("Thank you very much.", 48000, before_ms=300, after_ms=800))
    try:
        await until(lambda: "thank" in heard_since(livekit_server, TOM, asked_at), 90,
                    "Tom to hear the agent answer his thanks")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; Tom heard {heard_since(livekit_server, TOM, asked_at)}\n"
                             f"{worker.log()[-3000:]}") from None
    assert livekit_server.sip_call_to(TOM).status == "active"

    await livekit_server.phone_hang_up(tom.call_id)
    await until(lambda: job_ended(livekit_server, rooms[TOM]), 30, "Tom's job to end")
    text = await metrics(metrics_port)
    assert 'duplex_dial_outcomes_total{outcome="answered"} 2.0' in text
    assert 'duplex_dial_outcomes_total{outcome="busy"} 1.0' in text
    assert "Traceback" not in worker.log() and "Traceback" not in backend.log()
