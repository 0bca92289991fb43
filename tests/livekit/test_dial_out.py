"""Outbound calls: ``duplex-agent dial`` and a job's ``{"dial": ...}`` metadata make the worker call a
phone through the loopback server's SIP service. Several calls go at once, as a deployed worker
places them (one worker on a remote backend, a ``serve`` process): an answered call is served from
its first word on its own line, one answered in silence is spoken to first, one not answered ends
the job with its reason in the log, /metrics and the room's events, and a phone hanging up mid-call
leaves the other call going."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from livekit import rtc
from livekit.protocol import agent as agent_pb

from devtools.livekit_server.sip import Answer, Phone
from devtools.speech import speak, words
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.serve_process import environment
from tests.support.heard import phone_heard, replied_and_quiet, spoken_to_first
from tests.support.ports import free_port
from tests.support.waits import until

MARIA = "+15551230001"
BUSY = "+15551230002"
TOM = "+15551230003"
SILENT = "+15551230004"


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


def heard_since(server, number: str, since: float = 0.0) -> list[str]:
    """The words the phone at ``number`` heard down its line since ``since`` (monotonic s)."""
    return words(phone_heard(server.sip_call_to(number), since))


async def test_three_calls_at_once_through_a_remote_backend_each_served_on_its_own_line(
        livekit_server, start_serve, ready_worker):
    backend = await start_serve(plugin="reference", max_sessions=4)
    metrics_port = free_port()
    worker = await ready_worker(backend=backend.realtime_url, max_sessions=4,
                                extra=("--metrics-port", str(metrics_port)))
    trunk = await livekit_server.add_sip_trunk()
    await livekit_server.add_phone(MARIA, Phone(rings_for_s=0.5, greeting=speak("Good morning, Maria speaking.", 48000)))
    await livekit_server.add_phone(TOM, Phone(rings_for_s=0.8, greeting=speak("Hello, Tom speaking.", 48000)))
    await livekit_server.add_phone(BUSY, Phone(answer=Answer.BUSY, rings_for_s=0.5))
    await livekit_server.add_phone(SILENT, Phone(rings_for_s=0.5, noise_dbfs=-45.0))

    # Bad input is refused before anything is dispatched.
    code, out = await run_cli(livekit_server, "5551230001", "--trunk", trunk)
    assert code == 2 and "E.164" in out, out
    code, out = await run_cli(livekit_server, MARIA, "--trunk", "ST_nosuchtrunk")
    assert code == 2 and "no outbound trunk 'ST_nosuchtrunk'" in out, out
    assert not livekit_server.dispatches

    # Three calls at once: Maria's from the CLI (with a digit to dial once answered), Tom's and the
    # busy one from jobs' metadata; the room of the busy call hears why it ended.
    rooms = {MARIA: "call-maria", TOM: "call-tom", BUSY: "call-busy", SILENT: "call-silent"}
    observer = RoomEvents()
    await observer.room.connect(livekit_server.url, livekit_server.mint_token("observer", rooms[BUSY]))
    (code, out), *_ = await asyncio.gather(
        run_cli(livekit_server, MARIA, "--trunk", trunk, "--room", rooms[MARIA], "--dtmf", "1"),
        *(livekit_server.create_dispatch(rooms[number], AGENT_NAME, DialRequest(number, trunk).to_metadata())
          for number in (TOM, BUSY)))
    assert code == 0 and rooms[MARIA] in out, out
    await until(lambda: job_ended(livekit_server, rooms[BUSY]), 60, "the busy call's job to end")
    await until(lambda: any(e.get("type") == "error" for e in observer.events), 10, "the room to hear why")
    error = next(e for e in observer.events if e.get("type") == "error")["error"]
    assert error["code"] == "dial_busy" and "486" in error["message"]
    await observer.room.disconnect()
    assert f"the call to {BUSY} was not answered: busy (SIP 486 Busy Here)" in worker.log()

    # Each answered phone hears the agent answer its own greeting, not the other's.
    heard: dict[str, list[str]] = {}

    # Two passes of Whisper through a phone line (the worker's ear, then this test's on the echo)
    # garble words now and then; "morning" and "Tom" come through.
    def answered(number: str, own: str, other: str) -> bool:
        call = livekit_server.sip_call_to(number)
        if call is None or call.status != "active":
            return False
        heard[number] = heard_since(livekit_server, number)
        assert other not in heard[number], f"{number} heard the other call: {heard[number]}"
        return {"said", own} <= set(heard[number])

    try:
        await until(lambda: all([answered(MARIA, "morning", "tom"), answered(TOM, "tom", "morning")]), 120,
                    "both phones to hear the agent answer their greeting")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; heard {heard}\n{worker.log()[-3000:]}") from None

    assert [k.digit for k in livekit_server.sip_call_to(MARIA).keys if k.source == "dial"] == ["1"]

    # A fourth call, beside the two live ones, answered by a person who says nothing: once the line
    # was quiet for the request's wait, the backend's model asked whether it can be heard.
    await livekit_server.create_dispatch(rooms[SILENT], AGENT_NAME,
                                         DialRequest(SILENT, trunk, quiet_answer_s=2.0).to_metadata())
    await until(lambda: replied_and_quiet(livekit_server.sip_call_to(SILENT)), 60, "the agent to speak into the silent line")
    spoken_to_first(livekit_server.sip_call_to(SILENT), 2.0)
    await livekit_server.phone_hang_up(livekit_server.sip_call_to(SILENT).call_id)

    # Maria hangs up; Tom's call goes on and is answered again.
    await livekit_server.phone_hang_up(livekit_server.sip_call_to(MARIA).call_id)
    await until(lambda: job_ended(livekit_server, rooms[MARIA]), 30, "Maria's job to end")
    job_id = job_of_room(livekit_server, rooms[MARIA]).id
    await until(lambda: f"job {job_id} ends after 1 session" in worker.log(), 30, "Maria's session to end")
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
    assert 'duplex_dial_outcomes_total{outcome="answered"} 3.0' in text
    assert 'duplex_dial_outcomes_total{outcome="busy"} 1.0' in text
    assert "Traceback" not in worker.log() and "Traceback" not in backend.log()
