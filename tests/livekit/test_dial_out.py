"""Outbound calls: ``duplex-agent dial`` and a job's ``{"dial": ...}`` metadata make the worker call a
phone through the loopback server's SIP service; an answered call is served from its first word,
one not answered ends the job with its reason in the log, /metrics and the room's events."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from livekit import rtc
from livekit.protocol import agent as agent_pb

from devtools.livekit_server.sip import Answer, Phone
from devtools.speech import speak, transcribe, words
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.serve_process import environment
from tests.support.ports import free_port
from tests.support.waits import until

PERSON = "+15551230001"
BUSY = "+15551230002"


async def run_cli(server, *args: str, secret: str | None = None) -> tuple[int, str]:
    env = environment(LIVEKIT_URL=server.url, LIVEKIT_API_KEY=server.api_key,
                      LIVEKIT_API_SECRET=secret or server.api_secret, DUPLEX_AGENT_NAME=AGENT_NAME)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "duplex_agent.agent.app.cli", "dial", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


async def metrics(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        return await response.text()


def job_of_room(server, room: str):
    return next((job for job in server.jobs.values() if job.room == room), None)


def job_ended(server, room: str) -> bool:
    job = job_of_room(server, room)
    return job is not None and (job.terminated or job.status in (agent_pb.JobStatus.JS_SUCCESS,
                                                                  agent_pb.JobStatus.JS_FAILED))


class RoomEvents:
    """An observer in the room (no microphone, so never served): the ``duplex.events`` it gets."""

    def __init__(self) -> None:
        self.room = rtc.Room()
        self.events: list[dict] = []

        async def read(reader: rtc.TextStreamReader, sender: str) -> None:
            self.events.append(json.loads(await reader.read_all()))

        self.room.register_text_stream_handler(
            "duplex.events", lambda reader, sender: asyncio.ensure_future(read(reader, sender)))


async def test_dial_out_answered_and_busy(livekit_server, ready_worker):
    metrics_port = free_port()
    worker = await ready_worker(extra=("--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(PERSON, Phone(rings_for_s=1.0, greeting=speak("Good morning, Maria speaking.", 48000)))
    await livekit_server.add_phone(BUSY, Phone(answer=Answer.BUSY, rings_for_s=0.5))

    # Bad input is refused before anything is dispatched.
    code, out = await run_cli(livekit_server, "5551230001", "--trunk", trunk)
    assert code == 2 and "E.164" in out, out
    code, out = await run_cli(livekit_server, PERSON, "--trunk", "ST_nosuchtrunk")
    assert code == 2 and "no outbound trunk 'ST_nosuchtrunk'" in out, out
    assert not livekit_server.dispatches

    # A busy phone, from a job's metadata: the job ends with the reason, told to the room.
    observer = RoomEvents()
    await observer.room.connect(livekit_server.url, livekit_server.mint_token("observer", "busy-call"))
    await livekit_server.create_dispatch("busy-call", AGENT_NAME, DialRequest(BUSY, trunk).to_metadata())
    await until(lambda: job_ended(livekit_server, "busy-call"), 60, "the busy call's job to end")
    await until(lambda: any(e.get("type") == "error" for e in observer.events), 10, "the room to hear why")
    error = next(e for e in observer.events if e.get("type") == "error")["error"]
    assert error["code"] == "dial_busy" and "486" in error["message"]
    await observer.room.disconnect()
    assert f"the call to {BUSY} was not answered: busy (SIP 486 Busy Here)" in worker.log()
    assert "Traceback" not in worker.log()

    # A person answers, from the CLI: the agent hears their first words and answers them down the line.
    code, out = await run_cli(livekit_server, PERSON, "--trunk", trunk, "--room", "person-call", "--dtmf", "1")
    assert code == 0 and "person-call" in out, out
    await until(lambda: livekit_server.sip_call_to(PERSON) is not None
                and livekit_server.sip_call_to(PERSON).status == "active", 60, "the phone to answer")
    call = livekit_server.sip_call_to(PERSON)
    assert [k.digit for k in call.keys if k.source == "dial"] == ["1"]

    # The greeting, said the moment the phone answered, comes back in the agent's echo.
    last_heard: list[str] = []

    def reply_heard() -> bool:
        heard = livekit_server.sip_call_to(PERSON).heard_audio()
        if not (heard.size and float(abs(heard).max()) > 0.05):
            return False
        last_heard[:] = words(transcribe(heard, 8000))
        # Two passes of Whisper through a phone line (the worker's ear, then this test's on the echo)
        # often garble "Good morning, Maria": the echo of the greeting's last word is what is required.
        return {"said", "speaking"} <= set(last_heard)

    try:
        await until(reply_heard, 90, "the agent's reply to the greeting down the phone line")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the phone heard {' '.join(last_heard)!r}\n{worker.log()[-3000:]}") from None

    await livekit_server.phone_hang_up(call.call_id)
    await until(lambda: job_ended(livekit_server, "person-call"), 30, "the answered call's job to end")
    job_id = job_of_room(livekit_server, "person-call").id
    await until(lambda: f"job {job_id} ends after 1 session" in worker.log(), 30, "the session to end")
    text = await metrics(metrics_port)
    assert 'duplex_dial_outcomes_total{outcome="busy"} 1.0' in text
    assert 'duplex_dial_outcomes_total{outcome="answered"} 1.0' in text
