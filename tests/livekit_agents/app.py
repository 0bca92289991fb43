"""The LiveKit Agents app the tests run as a real worker process: an AgentSession on our DuplexModel.

Configured by the environment: DUPLEX_TEST_URL (a duplex websocket) or DUPLEX_TEST_PLUGIN and
DUPLEX_TEST_OPTIONS (JSON) for in_process; DUPLEX_TEST_SESSION (JSON) the model's ``session``;
DUPLEX_TEST_STALL_S blocks the job's loop that long once, in the first reply;
DUPLEX_TEST_ATTACH=1 builds the AgentSession outside the job's context (livekit-agents sees no
job), named to the model with ``attach`` as an app that runs sessions itself does; DUPLEX_TEST_TOOLS=1
gives the Agent a get_weather ``@function_tool`` (each run recorded); every history item,
error, close and user and agent state change goes to the JSON lines file DUPLEX_TEST_RECORD, stamped
with the time, for the test to read (and a failure's reader: it stays in the test's tmp_path).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import time

import numpy as np
from livekit import agents
from livekit.agents import Agent, AgentServer, AgentSession, JobExecutorType, RunContext, function_tool

from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.livekit_agents import DuplexModel
from duplex_agent.webrtc.livekit.pcm import frame_samples

AGENT_NAME = "duplex-lk-test"
RECORD = os.environ["DUPLEX_TEST_RECORD"]


def _model() -> DuplexModel:
    session = json.loads(os.environ.get("DUPLEX_TEST_SESSION", "{}"))
    if url := os.environ.get("DUPLEX_TEST_URL"):
        # the reference model on a loaded 2-core machine can take seconds per sentence
        return DuplexModel(url, session=session, options=RemoteOptions(stall_timeout_s=20.0))
    return DuplexModel.in_process(os.environ.get("DUPLEX_TEST_PLUGIN", "reference"), session=session,
                                  **json.loads(os.environ.get("DUPLEX_TEST_OPTIONS", "{}")))


MODEL = _model()
# the default load is the machine's CPU, which a loaded test machine would report as full
server = AgentServer(job_executor_type=JobExecutorType.THREAD, port=0, drain_timeout=10, load_fnc=lambda: 0.0)


def _record(room: str, kind: str, **data) -> None:
    with open(RECORD, "a") as f:
        f.write(json.dumps({"room": room, "kind": kind, "at": round(time.time(), 3), **data}) + "\n")


def _log_room_input() -> None:
    """For a failure's diagnosis: livekit-agents' debug records of the room's input streams (a
    track read or closed, the input attached or detached), none of its other debug records, and
    every event of our model but its deltas (a turn's course: speech, commit, transcript, reply)."""
    logging.getLogger("duplex_agent.livekit_agents").setLevel(logging.DEBUG)
    lk = logging.getLogger("livekit.agents")
    lk.setLevel(logging.DEBUG)
    if not lk.filters:
        lk.addFilter(lambda record: record.levelno > logging.DEBUG or "room_io" in record.pathname)


@server.rtc_session(agent_name=AGENT_NAME)
async def entrypoint(ctx: agents.JobContext) -> None:
    _log_room_input()
    if os.environ.get("DUPLEX_TEST_ATTACH"):
        await ctx.connect()  # AgentSession.start connects the job's room only when it sees the job
        # an empty context: get_job_context() is None in the session and all the tasks it starts
        await asyncio.create_task(_run_session(ctx, attach=True), context=contextvars.Context())
    else:
        await _run_session(ctx, attach=False)


_stalled: set[str] = set()


def _stall_once(room: str, loop: asyncio.AbstractEventLoop, ev, stall_s: float) -> None:
    """DUPLEX_TEST_STALL_S: 0.5 s into the agent's first reply the job's loop is blocked that
    long, as a loaded machine blocks it."""
    if ev.new_state != "speaking" or room in _stalled:
        return
    _stalled.add(room)

    def stall() -> None:
        time.sleep(stall_s)
        _record(room, "stalled", seconds=stall_s)

    loop.call_later(0.5, stall)


#: A caller frame this loud (RMS, about -36 dBFS) is speech, not the silence around it.
LOUD_RMS = 500.0 / 32768


def _count_caller_audio(room: str, session: AgentSession, duplex, rtc_room) -> None:
    """For a failure's diagnosis (a reply that never comes: where was the caller's speech lost?):
    how much caller audio reached our model, how much of it was loud and the turn detection it
    was judged with, recorded at close and
    when AgentSession marks the caller away (no speech for 15 s), with the packets the agent's
    WebRTC stack had received of the caller's track by then."""
    loud = 0
    push = duplex.push_audio

    def push_counted(frame) -> None:
        nonlocal loud
        samples = frame_samples(frame)
        if samples.size and float(np.sqrt(np.mean(samples * samples))) >= LOUD_RMS:
            loud += 1
        push(frame)

    def record(when: str, **more) -> None:
        _record(room, "caller_audio", when=when, seconds=round(duplex.caller_audio_s, 2), loud_frames=loud,
                turn_detection=duplex.turn_detection, **more)

    async def record_with_packets() -> None:
        try:
            stats = await asyncio.wait_for(rtc_room.get_rtc_stats(), 5)
            packets = [s.inbound_rtp.received.packets_received  # v1 signal path: under the publisher's
                       for s in (*stats.subscriber_stats, *stats.publisher_stats)
                       if s.WhichOneof("stats") == "inbound_rtp"]
        except (TimeoutError, RuntimeError) as exc:  # the room already left
            packets = repr(exc)
        record("away", inbound_packets=packets)

    pending: set[asyncio.Future] = set()

    def on_away(ev) -> None:
        if ev.new_state == "away":
            task = asyncio.ensure_future(record_with_packets())
            pending.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(pending.discard)

    duplex.push_audio = push_counted  # AgentSession looks it up on the session for every frame
    session.on("user_state_changed", on_away)
    session.on("close", lambda ev: record("close"))  # at once: the job ends right after


@function_tool
async def get_weather(context: RunContext, city: str) -> str:
    """Today's weather in a city.

    Args:
        city: The city's name.
    """
    _record(context.session.room_io.room.name, "tool", name="get_weather", city=city)
    return f"sunny and 21 degrees in {city}"


def _record_speech(room: str, ev) -> None:
    """A speech AgentSession scheduled (a model's reply among them), and how it ended: a reply the
    caller never heard shows whether the session got it, and whether it was interrupted unplayed."""
    handle = ev.speech_handle
    _record(room, "speech", id=handle.id, source=ev.source, user_initiated=ev.user_initiated)
    handle.add_done_callback(lambda h: _record(room, "speech_done", id=h.id, interrupted=h.interrupted))


async def _run_session(ctx: agents.JobContext, *, attach: bool) -> None:
    room = ctx.room.name
    session = AgentSession(llm=MODEL, aec_warmup_duration=None)
    if attach:
        MODEL.attach(session)
    loop = asyncio.get_running_loop()

    def item_added(ev) -> None:
        # registered before the session starts, so ahead of the model's own listener: ``seen`` is the
        # text as the message was made; ``text`` is read once every listener has seen it
        item = ev.item
        if getattr(item, "type", "") != "message":
            return
        seen = item.text_content or ""

        def record_item() -> None:
            # an interrupted reply: also what our session acknowledged to the model as heard, what the
            # model had said of it, and how much of its audio the room played (read once every listener
            # of this event has run, as the text is)
            cut = session.current_agent.duplex_session.cut_replies[-1:] if item.interrupted else []
            _record(room, "item", role=item.role, text=item.text_content or "", seen=seen,
                    interrupted=item.interrupted, ledger=[c.heard for c in cut], said=[c.said for c in cut],
                    played_ms=[c.played_ms for c in cut], response_id=cut[0].response_id if cut else None)

        loop.call_soon(record_item)

    session.on("conversation_item_added", item_added)
    # ev.error is the model's RealtimeModelError; its own error carries the wire's code
    session.on("error", lambda ev: _record(room, "error", code=getattr(ev.error.error, "code", None),
                                           message=str(ev.error.error), recoverable=ev.error.recoverable))
    session.on("close", lambda ev: (_record(room, "close", reason=str(ev.reason)),
                                    ctx.shutdown("the agent session closed")))
    # for a failure's diagnosis: where the turn got to
    session.on("user_state_changed", lambda ev: _record(room, "user_state", state=ev.new_state))
    session.on("agent_state_changed", lambda ev: _record(room, "agent_state", state=ev.new_state))
    session.on("speech_created", lambda ev: _record_speech(room, ev))
    # the agent's own voice: AgentSession plays nothing until its track has a subscriber
    ctx.room.on("local_track_published", lambda pub, track: _record(room, "voice_published", sid=pub.sid))
    ctx.room.on("local_track_subscribed", lambda track: _record(room, "voice_subscribed", sid=track.sid))
    closed = asyncio.Event()
    session.on("close", lambda ev: closed.set())
    if stall_s := float(os.environ.get("DUPLEX_TEST_STALL_S", "0")):
        session.on("agent_state_changed", lambda ev: _stall_once(room, loop, ev, stall_s))
    tools = [get_weather] if os.environ.get("DUPLEX_TEST_TOOLS") else []
    await session.start(room=ctx.room, agent=Agent(instructions="Repeat what the caller says.", tools=tools))
    duplex = session.current_agent.duplex_session
    duplex.on("session_reconnected", lambda ev: _record(room, "reconnected"))
    # the adapter's bursts: the model's audio reached AgentSession as a generation
    session.current_agent.realtime_llm_session.on(
        "generation_created", lambda ev: _record(room, "generation", id=ev.response_id, user_initiated=ev.user_initiated))
    _count_caller_audio(room, session, duplex, ctx.room)
    # started for the test once the caller's audio reaches the model: AgentSession reads the room's
    # track only once it has subscribed to it, which on a loaded machine can come after start returns,
    # and a caller who spoke before then would have the start of their words cut off
    deadline = loop.time() + 60.0
    while duplex.caller_audio_s == 0.0 and not closed.is_set() and loop.time() < deadline:
        await asyncio.sleep(0.02)
    if duplex.caller_audio_s > 0.0:
        _record(room, "started")


if __name__ == "__main__":
    agents.cli.run_app(server)
