"""The real worker process, dispatched by agent name on the loopback LiveKit server,
talking with callers on the real livekit SDK."""

from __future__ import annotations

import re
import time

import numpy as np
import soxr
from livekit import rtc
from livekit.protocol import agent as agent_pb

from devtools.speech import speak, vocal_burst, words
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import AGENT_NAME
from tests.support.heard import reply_heard
from tests.support.waits import until

QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")


def _agent_identity(livekit_server, room: str) -> str | None:
    participants = livekit_server.rooms[room].participants if room in livekit_server.rooms else {}
    for identity, participant in participants.items():
        if participant.info.kind == 4:  # AGENT
            return identity
    return None


async def test_dispatched_worker_talks_with_a_caller(livekit_server, ready_worker):
    worker = await ready_worker()
    room = "call-1"
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token("alice", room))
    await caller.join()
    dispatch = await livekit_server.create_dispatch(room, AGENT_NAME)
    assert dispatch.state == "assigned"
    await until(lambda: _agent_identity(livekit_server, room) is not None, 30, "the agent to join")
    await until(lambda: "listening" in caller.agent_states, 30, "the agent's state")
    agent = _agent_identity(livekit_server, room)
    # A participant without a microphone (never served) who sees the agent's tracks come and go.
    observer = rtc.Room()
    unpublished: list[str] = []
    observer.on("track_unpublished", lambda publication, participant: unpublished.append(participant.identity))
    await observer.connect(livekit_server.url, livekit_server.mint_token("observer", room),
                           rtc.RoomOptions(auto_subscribe=False))  # no audio of the call to carry

    # One exchange: the caller's words and the agent's spoken echo.
    heard = await caller.say_and_hear(QUESTION)
    assert reply_heard(heard, "You said: " + QUESTION), heard
    user = [t for t in caller.transcripts if t.sender == "alice"]
    assert user and user[0].final and "table" in words(user[0].text)
    assert "lk.transcribed_track_id" in user[0].attributes and "lk.segment_id" in user[0].attributes
    reply = [t for t in caller.transcripts if t.sender == agent and t.final][0]
    assert words(reply.text)[:2] == ["you", "said"]
    assert {"thinking", "speaking", "listening"} <= set(caller.agent_states)

    # A grunt over a long reply: the agent pauses (its source's queue given back to the playout)
    # and goes on; then talk over it: the agent stops.
    caller.mic.say(speak(LONG, 48000, before_ms=300, after_ms=1200))
    before = len(caller.received)
    await until(lambda: caller.loud_frames(before) > 100, 40, "1 s of the agent's long reply")
    caller.mic.say(np.concatenate([vocal_burst(48.0), np.zeros(48000, np.float32), vocal_burst(48.0)]))
    burst_at = len(caller.received)
    await until(lambda: caller.loud_frames(burst_at) > 150, 40, "the long reply to go on over the grunts")
    cut = len(caller.received)
    long_reply = words("You said: " + LONG)

    def segment_of_long_reply() -> str | None:
        return next((t.attributes["lk.segment_id"] for t in caller.transcripts
                     if t.sender == agent and words(t.text)[:4] == long_reply[:4]), None)

    def answers() -> list:  # the agent's transcripts of replies after the long one
        return [t for t in caller.transcripts if t.sender == agent and t.at_frame >= cut
                and t.attributes.get("lk.segment_id") != segment_of_long_reply()]

    caller.mic.say(speak("Wait, stop please.", 48000, after_ms=1200))
    await until(lambda: answers(), 30, "the agent to answer the interruption")
    # From the interruption to the agent's next answer (over 1.5 s: the caller's words and
    # the silence window) the old reply, left alone, would fill most frames; stopped, it fills
    # only the way there and back through the loopback SFU.
    answer_at = answers()[0].at_frame
    window = answer_at - cut
    assert window >= 100
    assert caller.loud_frames(cut) - caller.loud_frames(answer_at) <= 0.4 * window
    assert "listening" in caller.agent_states[caller.agent_states.index("speaking"):]
    # The long reply's final transcript is cut to the words the caller heard.
    segment = [t for t in caller.transcripts if t.attributes.get("lk.segment_id") == segment_of_long_reply()]
    generated = max((words(t.text) for t in segment), key=len)
    heard = words([t for t in segment if t.final][-1].text)
    assert heard == generated[: len(heard)] and len(heard) < len(generated)

    # The caller leaves: the worker ends the session, takes its voice out of the room (a room the
    # server ends with a track still published keeps it in livekit's native core, a thread per
    # call), and once the room closes, ends the job.
    job_id = dispatch.job_id
    await caller.leave()
    await until(lambda: agent in unpublished, 30, "the agent to unpublish its voice")
    await observer.disconnect()
    await until(lambda: livekit_server.jobs[job_id].status in (agent_pb.JobStatus.JS_SUCCESS, agent_pb.JobStatus.JS_FAILED)
                   or livekit_server.jobs[job_id].terminated, 30, "the job to end")
    figures = re.search(r"call figures: .*'barge_ins': (\d+), 'false_pauses': (\d+)", worker.log())
    assert figures, worker.log()[-2000:]
    barge_ins, false_pauses = map(int, figures.groups())
    assert false_pauses >= 1 and barge_ins >= 1  # the grunts paused the reply, then the words cut it


async def test_sip_caller_with_dtmf_and_hang_up(livekit_server, ready_worker):
    worker = await ready_worker()
    room = "sip-call"
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token(
        "sip_+15550100", room, kind="sip", attributes={"sip.phoneNumber": "+15550100"}))
    await caller.join()
    dispatch = await livekit_server.create_dispatch(room, AGENT_NAME)
    await until(lambda: "listening" in caller.agent_states, 40, "the agent")
    agent = _agent_identity(livekit_server, room)

    # Telephone audio: band-limited to 8 kHz, carried in a 48 kHz track.
    narrow = soxr.resample(soxr.resample(speak(QUESTION, 48000), 48000, 8000), 8000, 48000).astype(np.float32)
    caller.mic.say(np.concatenate([np.zeros(14400, np.float32), narrow, np.zeros(57600, np.float32)]))
    await until(lambda: any(t.sender == agent and t.final for t in caller.transcripts), 40, "the agent's reply")
    user = [t for t in caller.transcripts if t.sender == "sip_+15550100"]
    assert user and "table" in words(user[0].text)

    # Quiet, the agent's voice goes out as DTX, as behind LiveKit: once the reply's tail and the
    # encoder's hangover are sent, a packet in 200-400 ms, not every 20 ms.
    await until(lambda: caller.agent_states[-1:] == ["listening"], 30, "the agent to be quiet")
    agent_track = next(iter(livekit_server.rooms[room].participants[agent].tracks))

    def agent_packets_ns(since_ns: int) -> list[int]:
        return [a.arrived_ns for a in livekit_server.forwarding()[0] if a.track_sid == agent_track and a.arrived_ns >= since_ns]

    quiet_ns = time.perf_counter_ns()

    def dtx_began() -> bool:
        arrivals = agent_packets_ns(quiet_ns)
        return any(later - earlier >= 100_000_000 for earlier, later in zip(arrivals, arrivals[1:]))

    await until(dtx_began, 10, "a 100 ms gap in the agent's packets (DTX)")
    heard, since_ns = len(caller.received), time.perf_counter_ns()
    await until(lambda: len(caller.received) >= heard + 200, 30, "2 s more of the agent's track")
    sent = agent_packets_ns(since_ns)
    assert caller.agent_states[-1] == "listening" and len(sent) <= 20, (caller.agent_states, len(sent))

    for code, digit in ((1, "1"), (2, "2"), (11, "#")):
        await caller.room.local_participant.publish_dtmf(code=code, digit=digit)
    await until(lambda: worker.log().count("DTMF") >= 3, 15, "the digits to reach the session")
    assert "DTMF 1" in worker.log() and "DTMF #" in worker.log()

    await caller.leave()  # hang up
    await until(lambda: livekit_server.jobs[dispatch.job_id].status != agent_pb.JobStatus.JS_RUNNING
                   or livekit_server.jobs[dispatch.job_id].terminated, 30, "the job to end")
    await until(lambda: "ends after 1 session" in worker.log(), 30, "the session to be freed")
