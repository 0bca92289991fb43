"""A phone caller of a LiveKit Agents app: the app's room gets a call placed through the loopback
server's SIP service (as an app's own ``create_sip_participant`` places it), AgentSession links the
SIP participant, and our DuplexModel serves it with the phone line's turn detection: the phone
hears the reply down its line."""

from __future__ import annotations

from livekit import api
from livekit.protocol import sip as sip_pb

from devtools.livekit_server.sip import Phone
from devtools.speech import speak, transcribe, words
from duplex_agent.webrtc.media.phone_callers import phone_turn_detection
from tests.livekit_agents.conftest import AGENT_NAME
from tests.support.waits import until

NUMBER = "+15551230021"
QUESTION = "Please book a table for two people tonight."


def closing_record(worker, room: str) -> dict | None:
    return next((r for r in worker.records("caller_audio", room) if r["when"] == "close"), None)


async def test_a_phone_caller_is_answered_and_judged_with_the_phone_lines_turn_detection(livekit_server, start_app):
    worker = await start_app()
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(NUMBER, Phone(rings_for_s=0.3))
    room = "phone-caller"
    await livekit_server.create_dispatch(room, AGENT_NAME)
    async with api.LiveKitAPI(livekit_server.url, livekit_server.api_key, livekit_server.api_secret) as lkapi:
        info = await lkapi.sip.create_sip_participant(sip_pb.CreateSIPParticipantRequest(
            sip_trunk_id=trunk, sip_call_to=NUMBER, room_name=room, wait_until_answered=True))
    await until(lambda: worker.records("started", room), 60, "the phone's audio to reach the model")

    await livekit_server.phone_say(info.sip_call_id, speak(QUESTION, 48000, before_ms=300, after_ms=1200))
    heard: list[str] = []

    def reply_heard() -> bool:
        audio = livekit_server.sip_call_to(NUMBER).heard_audio()
        if not (audio.size and float(abs(audio).max()) > 0.05):
            return False
        heard[:] = words(transcribe(audio, 8000))
        # two passes of Whisper through a phone line garble a word or two of the echo
        return "said" in heard and len({"book", "table", "two", "people", "tonight"} & set(heard)) >= 2

    try:
        await until(reply_heard, 90, "the agent's reply down the phone line")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the phone heard {' '.join(heard)!r}\n{worker.report()}") from None

    await livekit_server.phone_hang_up(info.sip_call_id)
    await until(lambda: closing_record(worker, room), 60, "the session to close with the call")
    assert closing_record(worker, room)["turn_detection"] == phone_turn_detection()
    assert not worker.records("error", room), worker.records("error", room)
