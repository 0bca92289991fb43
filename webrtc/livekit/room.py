"""LiveKit room I/O: one duplex conversation with the room's caller.

The caller is the participant named in the job's metadata, else the first
standard or SIP participant to publish a microphone; when they leave, the next
one. Only the caller's microphone is subscribed. The agent speaks through one
audio track fed from the shared ``CallAudioPath`` playout, with a two-frame
AudioSource queue that a pause empties (its audio goes back to the playout) and a
barge-in clears. Transcripts of both sides go out on ``lk.transcription`` text streams; the
agent's state is the ``lk.agent.state`` attribute (beside it ``duplex.turn_ms``,
``duplex.barge_in_ms`` and ``duplex.random_weights`` for the page); SIP DTMF digits
reach the session. The caller's
typed events -- ``error`` (a refusal, a lost backend) and ``session.closed`` --
go out as their wire JSON, one text message each on the ``duplex.events``
topic. A conversation the backend ends (``backend_lost``, ``shutting_down``)
ends the call with that reason: the agent leaves the room.

A draining worker asks each call to ``finish_after_current()`` (the live
conversation goes on; no next caller is taken) and, at its drain deadline,
to ``close("shutdown")``. Room writes go through a bounded queue: a room
that stops taking them loses the newest, never grows the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from livekit import api, rtc

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.codec import encode_event
from duplex_agent.agent.session.ports import AdmissionError, Conversation, DuplexBackend
from duplex_agent.agent.telephony.quiet_answer import QuietLine
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.webrtc.livekit.call_control import FAR_END_HOLDS_S, LiveKitCallControl
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.pcm import frame_samples
from duplex_agent.webrtc.media.call_audio import PAGE_FIGURES, CallAudioPath
from duplex_agent.webrtc.media.phone_callers import caller_turn_detection
from duplex_agent.webrtc.media.playout import SAMPLE_RATE
from duplex_agent.webrtc.media.transcript_deltas import TranscriptDeltas

if TYPE_CHECKING:
    from duplex_agent.agent.tools.edge_runner import RunnerTools
    from duplex_agent.agent.tools.toolbox import ToolBox

log = logging.getLogger("duplex_agent.livekit")

#: The AudioSource's own queue. livekit takes a capture once the queue then holds no more than
#: twice its size and acknowledges it once it is back down to its size, so with the 40 ms
#: captures below it holds 40-80 ms, paced by its own 10 ms ticker: a stall of the job's loop
#: shorter than two captures is not heard. A pause empties it the moment it is asked, the
#: capture still waiting included, and gives its audio back to the playout
#: (``AgentVoiceSource.take_back``); played on, it was the largest part of what the caller heard
#: beyond the LiveKit floor (bench.livekit_send_queue, bench.livekit_path). Queued, not
#: unqueued: the native source sends silence by itself while nothing is captured; a stream that
#: stops instead reached the caller late or stretched after quiet gaps (bench.livekit_quiet_gap).
SOURCE_QUEUE_MS = 40
#: The agent's voice goes to the source two playout frames (40 ms) at a time while that much is
#: queued: each capture is an FFI round trip that wakes the job's loop, so this halves them
#: while the agent speaks. The queue is emptied at a pause, so its depth costs no barge-in time.
VOICE_FRAMES_PER_CAPTURE = 2
#: Caller audio in 20 ms frames (the SDK's default is 10 ms), as the callers' Opus packets
#: come. Longer frames would wake the job's loop less often, for less CPU per call, but the
#: edge hears a barge-in's first sound only when the frame that holds it ends, so each extra
#: millisecond of frame is a millisecond more of the agent the caller hears over them. The
#: caller's ear wins over CPU (bench.livekit_path beside bench.livekit_vs_direct weighs the two;
#: docs/performance.md).
CALLER_FRAME_MS = 20
TRANSCRIPTION_TOPIC = "lk.transcription"
#: The caller's typed events (``error``, ``session.closed``), as on the direct path's data channel.
EVENTS_TOPIC = "duplex.events"
#: How long a call that ends may take to hand the room its last writes (its closing event) before leaving.
FLUSH_ROOM_WRITES_S = 5.0
#: Room writes (attributes, transcript streams) waiting for a room that is slow to take them.
MAX_QUEUED_ROOM_WRITES = 256
CALLER_KINDS = (rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD, rtc.ParticipantKind.PARTICIPANT_KIND_SIP)
#: The agent ended the call (a tool's hang-up).
HUNG_UP = "hung_up"


def preferred_caller(job_metadata: str) -> str | None:
    """The caller a dispatch names: metadata ``{"caller": identity}`` or a bare identity."""
    text = (job_metadata or "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict) and isinstance(data.get("caller"), str):
        return data["caller"]
    return None


def microphone_of(participant: rtc.RemoteParticipant) -> rtc.RemoteTrackPublication | None:
    for publication in participant.track_publications.values():
        if publication.kind == rtc.TrackKind.KIND_AUDIO and publication.source == rtc.TrackSource.SOURCE_MICROPHONE:
            return publication
    return None


class LiveKitRoomCall:
    """Serves the callers of one room, one at a time, until the room closes."""

    def __init__(self, room: rtc.Room, backend: DuplexBackend, *, caller_identity: str | None = None,
                 only_caller: bool = False, overlap_policy: str = "barge_in", tools: ToolBox | None = None,
                 room_api: api.LiveKitAPI | None = None,
                 control_type: type[LiveKitCallControl] = LiveKitCallControl) -> None:
        self.room = room
        self.backend = backend
        #: The worker's tools, given to each caller's call with a ``control_type`` for that caller
        #: (which hangs up through ``room_api`` when there is one).
        self.tools = tools
        self.room_api = room_api
        self.control_type = control_type
        self._hung_up: set[str] = set()  # callers the agent hung up on: not served again
        self.wanted_identity = caller_identity
        #: Serve ``caller_identity`` alone (the party an outbound call dialled), no one else.
        self.only_caller = only_caller and caller_identity is not None
        self._end_once_served = False  # set when the dialled party answered: their leaving ends the call
        self._wanted_served = False
        self._greeting: str | None = None  # said as soon as the wanted caller's conversation opens
        self._greeting_task: asyncio.Task[bool] | None = None
        self._quiet = QuietLine(lambda: asyncio.get_running_loop().time())
        self._conversation_opened = asyncio.Event()
        self._conversation_opened_at = 0.0  # loop time
        #: Called with whether the agent's greeting was still being said, when the wanted caller
        #: leaves (an outbound call's far end hanging up), before their call is ended.
        self.on_wanted_caller_left: Callable[[bool], None] | None = None
        #: The model hears silence instead of the caller (a voicemail greeting it must not answer).
        self.caller_muted = False
        #: Also given each frame of the caller's audio (48 kHz), e.g. to tell a voicemail box.
        self.caller_audio_tap: Callable[[np.ndarray, int], None] | None = None
        self.overlap_policy = overlap_policy
        self.source = AgentVoiceSource(SAMPLE_RATE, 1, queue_size_ms=SOURCE_QUEUE_MS)
        self.caller: rtc.RemoteParticipant | None = None
        self.conversation: Conversation | None = None
        self.path: CallAudioPath | None = None
        self.sessions_served = 0
        self._caller_changed = asyncio.Event()
        #: Set when the room closes or the call is closed; ``_end_reason`` says which.
        self._room_closed = asyncio.Event()
        self._end_reason = "room_closed"
        #: The reason of a conversation the backend ended (not the caller, not us): the call ends with it.
        self._ended_by_backend: str | None = None
        self._finishing = False  # draining: end after the current caller, take no next one
        self._finished = asyncio.Event()  # ``run`` has ended its call and returned
        #: Room writes (attributes, transcript streams) happen one after another, in order.
        self._room_writes: asyncio.Queue[Callable[[], Awaitable[Any]]] = asyncio.Queue(MAX_QUEUED_ROOM_WRITES)
        self.dropped_room_writes = 0
        self._writer_task: asyncio.Task[None] | None = None
        self._call_tasks: list[asyncio.Task[Any]] = []
        self._side_tasks: list[asyncio.Task[Any]] = []  # a greeting being said: the call goes on without it
        self._agent_segment: tuple[str, rtc.TextStreamWriter] | None = None
        # Each delta written is an FFI request and callback: a reply's words go out joined.
        self._deltas = TranscriptDeltas(
            lambda d: self._later(lambda: self._agent_transcript(d.response_id, d.delta)))
        self._published = False  # the agent has shown itself in the room (its voice, its state)
        self._voice: rtc.LocalTrackPublication | None = None  # the agent's voice track, while published
        self._conversation_open = False

    # ---- lifecycle ----

    async def run(self) -> None:
        await self._publish_voice()
        self._published = True
        self._writer_task = asyncio.create_task(self._write_to_room(), name="livekit-room-writes")
        self.room.on("track_published", self._on_track_published)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        self.room.on("sip_dtmf_received", self._on_dtmf)
        self.room.on("disconnected", lambda *_: self._room_closed.set())
        self._set_state("listening")
        try:
            while not self._room_closed.is_set() and not self._finishing:
                if self._end_once_served and self._wanted_served:
                    break
                caller = self._choose_caller()
                if caller is None:
                    if self.sessions_served:  # its caller gone, the room may end: leave no track published
                        await self._unpublish_voice()
                    await self._wait(self._caller_changed)
                    continue
                if self._voice is None:
                    await self._publish_voice()
                await self._serve(caller)
        finally:
            await self._end_call(self._end_reason)
            self._deltas.cancel()
            if self.room.isconnected():  # the closing event reaches the room before the agent leaves it
                try:
                    await asyncio.wait_for(self._room_writes.join(), FLUSH_ROOM_WRITES_S)
                except TimeoutError:
                    log.warning("the room took no writes for %g s; leaving without them", FLUSH_ROOM_WRITES_S)
            if self._writer_task is not None:
                self._writer_task.cancel()
                await asyncio.gather(self._writer_task, return_exceptions=True)
            await self._unpublish_voice()
            # The native source ticks every 10 ms until disposed; left to the garbage collector,
            # every call a worker had served kept one ticking (its cost grew with calls served).
            await self.source.aclose()
            self._finished.set()

    async def _publish_voice(self) -> None:
        track = rtc.LocalAudioTrack.create_audio_track("agent-voice", self.source.source)
        # DTX (the SDK's default, said here as a choice): LiveKit then answers it on, and the quiet
        # stretches go as a packet in 200-400 ms; a reply after quiet is heard no later for it.
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE, dtx=True)
        self._voice = await self.room.local_participant.publish_track(track, options)

    async def _unpublish_voice(self) -> None:
        """The agent's voice out of the room, while it still can be taken out.

        A room the server ends (its caller gone, deleted, the agent removed) with a local track
        still published keeps that track in livekit's native core for the life of the process,
        with its source's capture thread: a thread and its memory for every call served. A
        track unpublished before that leaves nothing behind.
        """
        if self._voice is None or not self.room.isconnected():
            return
        publication, self._voice = self._voice, None
        try:
            await self.room.local_participant.unpublish_track(publication.sid)
        except Exception as exc:  # the room is going anyway: it only costs what is described above
            log.warning("unpublishing the agent's voice in room %s failed: %s", self.room.name, exc)

    def end_once_served(self) -> None:
        """End the call once the wanted caller has been served and left (an answered outbound call:
        the called party hanging up ends it)."""
        self._end_once_served = True
        self._caller_changed.set()

    def speak_first(self, greeting: str) -> None:
        """The model says ``greeting`` now, not waiting to be spoken to (an answered outbound call);
        for a caller not yet served, as soon as their conversation opens."""
        if self.path is not None:
            self._greeting_task = asyncio.create_task(self.path.say(greeting), name="livekit-greeting")
            self._side_tasks.append(self._greeting_task)
        else:
            self._greeting = greeting

    def speak_if_quiet(self, text: str, after_s: float, *, since: float) -> None:
        """The model says ``text`` if no one speaks for ``after_s`` from ``since`` (loop time: an
        outbound call's answer), or from the caller's conversation opening when that is later."""
        task = asyncio.create_task(self._speak_if_quiet(text, after_s, since), name="livekit-quiet-answer")
        self._side_tasks.append(task)

    async def _speak_if_quiet(self, text: str, after_s: float, since: float) -> None:
        await self._conversation_opened.wait()
        if not await self._quiet.quiet_for(after_s, since=max(since, self._conversation_opened_at)):
            return
        if self.path is not None:
            log.info("room %s: no one spoke for %g s after the answer; the agent speaks first", self.room.name,
                     after_s)
            await self.path.say(text)

    def _greeting_unfinished(self) -> bool:
        return self._greeting is not None or (self._greeting_task is not None and not self._greeting_task.done())

    async def say(self, text: str) -> bool:
        """The model says ``text`` to the caller; True once they heard it to its end."""
        return await self.path.say(text) if self.path is not None else False

    def mute_caller(self) -> None:
        """From now on the model hears silence instead of the caller, and forgets the turn they
        were in the middle of (a voicemail greeting it must not answer)."""
        self.caller_muted = True
        if self.conversation is not None:
            self.conversation.send(p.InputAudioBufferClear())

    async def let_voice_arrive(self) -> None:
        """Until what the agent said has reached the caller's ear, down their line."""
        await self._voice_sent()
        await asyncio.sleep(FAR_END_HOLDS_S)

    def tell_room(self, event: p.ErrorEvent | p.SessionClosed) -> None:
        """One typed event for the room's participants (``duplex.events``), before anything the call says after it."""
        self._tell_room(event)

    def finish_after_current(self) -> None:
        """Let the live conversation go on until its caller leaves; then end, taking no next caller."""
        self._finishing = True
        self._caller_changed.set()

    async def close(self, reason: str) -> None:
        """End the call now: its conversation closes with ``reason``; returns once ``run`` has."""
        if not self._room_closed.is_set():
            self._end_reason = reason
            self._room_closed.set()
        await self._finished.wait()

    async def _wait(self, event: asyncio.Event) -> None:
        event.clear()
        closed = asyncio.ensure_future(self._room_closed.wait())
        changed = asyncio.ensure_future(event.wait())
        await asyncio.wait({closed, changed}, return_when=asyncio.FIRST_COMPLETED)
        for future in (closed, changed):
            future.cancel()

    def _choose_caller(self) -> rtc.RemoteParticipant | None:
        candidates = [
            participant for participant in self.room.remote_participants.values()
            if participant.kind in CALLER_KINDS and microphone_of(participant) is not None
        ]
        candidates = [participant for participant in candidates if participant.identity not in self._hung_up]
        for participant in candidates:
            if participant.identity == self.wanted_identity:
                return participant
        return candidates[0] if candidates and not self.only_caller else None

    # ---- one caller ----

    async def _serve(self, caller: rtc.RemoteParticipant) -> None:
        publication = microphone_of(caller)
        assert publication is not None
        try:
            self.conversation = await self.backend.open()
        except AdmissionError as exc:
            log.warning("cannot serve %s: %s", caller.identity, exc)
            self._tell_room(p.ErrorEvent.of(exc.code, str(exc), error_type="server_error"))
            await self._wait(self._caller_changed)
            return
        self._ended_by_backend = None
        self.caller = caller
        self.sessions_served += 1
        log.info("serving %s (%s) in room %s", caller.identity, rtc.ParticipantKind.Name(caller.kind), self.room.name)
        self.path = CallAudioPath(
            self.conversation, overlap_policy=self.overlap_policy, on_event=self._on_event,
            on_state=self._set_state, on_playout_cleared=self.source.clear_queue,
            on_paused=self.source.take_back, on_closed=self._on_conversation_closed,
            on_cut_short=self._on_cut_short, tools=self._tools_for(caller),
            turn_detection=caller_turn_detection(caller.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP),
        )
        self._conversation_open = True
        await self.path.start()
        self._conversation_opened_at = asyncio.get_running_loop().time()
        self._conversation_opened.set()
        greet: asyncio.Task[bool] | None = None
        if self._greeting is not None:
            greeting, self._greeting = self._greeting, None
            greet = self._greeting_task = asyncio.create_task(self.path.say(greeting), name="livekit-greeting")
        publication.set_subscribed(True)
        self._call_tasks = [
            asyncio.create_task(self._read_caller(publication), name="livekit-caller-audio"),
            asyncio.create_task(self._speak(), name="livekit-agent-voice"),
        ]
        if greet is not None:
            self._side_tasks.append(greet)
        await self._wait(self._caller_changed)
        while not self._room_closed.is_set() and self._caller_present():
            await self._wait(self._caller_changed)
        if self._ended_by_backend is not None and not self._room_closed.is_set():
            self._end_reason = self._ended_by_backend
            self._room_closed.set()
        elif not self._room_closed.is_set():
            left = caller.identity not in self._hung_up
            if left and caller.identity == self.wanted_identity and self.on_wanted_caller_left is not None:
                self.on_wanted_caller_left(self._greeting_unfinished())
            await self._end_call("caller_left" if left else HUNG_UP)
        if caller.identity == self.wanted_identity:
            self._wanted_served = True

    def _caller_present(self) -> bool:
        caller = self.caller
        return caller is not None and caller.identity in self.room.remote_participants \
            and caller.identity not in self._hung_up \
            and microphone_of(caller) is not None and self._conversation_open \
            and not any(task.done() for task in self._call_tasks)

    def _tools_for(self, caller: rtc.RemoteParticipant) -> RunnerTools | None:
        if self.tools is None:
            return None
        control = self.control_type(self.room, caller, end_call=lambda reason: self._hang_up(caller, reason),
                                    room_api=self.room_api, voice_sent=self._voice_sent)
        return self.tools.for_call(CallInfo(self.room, caller.identity, control))

    async def _voice_sent(self) -> None:
        """Until the agent's voice queued in the track's source has been sent."""
        await asyncio.sleep(self.source.held_ms() / 1000.0)

    def _hang_up(self, caller: rtc.RemoteParticipant, reason: str) -> None:
        """The agent ends its call with ``caller`` (when it cannot remove them from the room): they
        are told, and not served again while they stay."""
        if caller.identity in self._hung_up:
            return
        log.info("the agent ends its call with %s (%s)", caller.identity, reason)
        self._hung_up.add(caller.identity)
        self._tell_room(p.SessionClosed(HUNG_UP))
        self._caller_changed.set()

    def _on_conversation_closed(self) -> None:
        self._conversation_open = False
        self._caller_changed.set()

    async def _end_call(self, reason: str) -> None:
        for task in self._call_tasks + self._side_tasks:
            task.cancel()
        await asyncio.gather(*self._call_tasks, *self._side_tasks, return_exceptions=True)
        self._call_tasks, self._side_tasks = [], []
        self._deltas.flush()
        if self.path is not None:
            log.info("call figures: %s", self.path.figures_message())
            await self.path.close()
            self.path = None
        if self.conversation is not None:
            await self.conversation.close(reason)
            log.info("session %s closed (%s)", self.conversation.session_id, reason)
            self.conversation = None
        self._later(self._close_agent_segment)
        self.caller = None
        self.source.clear_queue()
        if self._published and not self._room_closed.is_set():
            self._set_state("listening")

    async def _read_caller(self, publication: rtc.RemoteTrackPublication) -> None:
        while publication.track is None:
            await asyncio.sleep(0.02)
        stream = CallerAudioStream(publication.track, SAMPLE_RATE, frame_size_ms=CALLER_FRAME_MS)
        try:
            async for frame in stream:
                samples = frame_samples(frame)
                if self.path is not None:
                    heard = np.zeros_like(samples) if self.caller_muted else samples
                    self.path.push_caller_frame(heard, frame.sample_rate)
                if self.caller_audio_tap is not None:
                    self.caller_audio_tap(samples, frame.sample_rate)
        finally:
            await stream.aclose()

    async def _speak(self) -> None:
        if self.path is not None:
            path = self.path
            await self.source.play(path.playout, path.next_frame, frames_per_capture=VOICE_FRAMES_PER_CAPTURE,
                                   sounding=lambda: path.hold_sounding)

    # ---- room events ----

    def _on_track_published(self, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant) -> None:
        if publication.source == rtc.TrackSource.SOURCE_MICROPHONE:
            self._caller_changed.set()

    def _on_participant_disconnected(self, participant: rtc.RemoteParticipant) -> None:
        if self.caller is not None and participant.identity == self.caller.identity:
            log.info("caller %s left", participant.identity)
        self._caller_changed.set()

    def _on_dtmf(self, dtmf: rtc.SipDTMF) -> None:
        if self.conversation is None or self.caller is None:
            return
        if dtmf.participant is not None and dtmf.participant.identity != self.caller.identity:
            return
        self.conversation.send(p.InputDtmf(digit=dtmf.digit))

    # ---- transcripts and state ----

    def _set_state(self, state: str) -> None:
        if self._published and self.room.isconnected():
            attributes = {"lk.agent.state": state, **self._page_attributes()}
            self._later(lambda: self.room.local_participant.set_attributes(attributes))

    def _page_attributes(self) -> dict[str, str]:
        """What the page shows besides the state (it has no data channel here): the call's latest
        figures, in ms, and whether the model's weights are random."""
        attributes = {"duplex.random_weights": "true"} if self.backend.capabilities.random_weights else {}
        if self.path is not None:
            for name in PAGE_FIGURES:
                last = self.path.figures.last(name)
                if last is not None:
                    attributes[f"duplex.{name}"] = f"{last:.0f}"
        return attributes

    def _on_event(self, event: p.ServerEvent) -> None:
        self._quiet.observe(event)
        if isinstance(event, p.ResponseTranscriptDelta):
            self._deltas.hold(event)
            return
        self._deltas.flush()  # the room gets the conversation in its order
        if isinstance(event, p.InputTranscriptionCompleted) and self.caller is not None:
            caller = self.caller
            self._later(lambda: self._send_user_transcript(caller, event.transcript))
        elif isinstance(event, p.ResponseTranscriptDone):
            self._later(lambda: self._agent_transcript(event.response_id, None, final=event.transcript))
        elif isinstance(event, p.ResponseDone) and event.status != "completed":
            self._later(self._close_agent_segment)
        elif isinstance(event, p.ErrorEvent):
            log.warning("session error %s: %s", event.code, event.error.get("message"))
            self._tell_room(event)
        elif isinstance(event, p.SessionClosed):  # the backend ended it (our own close stops the path first)
            self._ended_by_backend = event.reason
            self._tell_room(event)
        elif isinstance(event, p.DtmfReceived):
            log.info("DTMF %s from %s", event.digit, self.caller.identity if self.caller else "?")

    def _tell_room(self, event: p.ErrorEvent | p.SessionClosed) -> None:
        """One typed event for the room's participants: its wire JSON as a text message on ``duplex.events``."""
        text = json.dumps(encode_event(event), separators=(",", ":"))
        self._later(lambda: self.room.local_participant.send_text(text, topic=EVENTS_TOPIC))

    def _on_cut_short(self, response_id: str, heard: str) -> None:
        """The caller heard only part of a reply: its final transcript says just that part."""
        self._deltas.flush()
        self._later(lambda: self._agent_transcript(response_id, None, final=heard))

    async def _send_user_transcript(self, caller: rtc.RemoteParticipant, text: str) -> None:
        if not text:
            return
        attributes = {"lk.segment_id": f"SG_{uuid.uuid4().hex[:12]}", "lk.transcription_final": "true"}
        microphone = microphone_of(caller)
        if microphone is not None:
            attributes["lk.transcribed_track_id"] = microphone.sid
        writer = await self.room.local_participant.stream_text(
            topic=TRANSCRIPTION_TOPIC, attributes=attributes, sender_identity=caller.identity)
        await writer.write(text)
        await writer.aclose()

    async def _agent_transcript(self, response_id: str, delta: str | None, *, final: str | None = None) -> None:
        """Interim text on one stream per response, then the final text on its own stream
        (sent again, shorter, when the caller turned out to hear only part of it)."""
        if delta:
            if self._agent_segment is None or self._agent_segment[0] != response_id:
                await self._close_agent_segment()
                writer = await self.room.local_participant.stream_text(
                    topic=TRANSCRIPTION_TOPIC, attributes=self._agent_attributes(response_id, final=False))
                self._agent_segment = (response_id, writer)
            await self._agent_segment[1].write(delta)
        if final is not None:
            if self._agent_segment is not None and self._agent_segment[0] == response_id:
                await self._close_agent_segment()
            await self.room.local_participant.send_text(
                final.strip(), topic=TRANSCRIPTION_TOPIC, attributes=self._agent_attributes(response_id, final=True))

    def _agent_attributes(self, response_id: str, *, final: bool) -> dict[str, str]:
        attributes = {"lk.segment_id": response_id, "lk.transcription_final": "true" if final else "false"}
        for publication in self.room.local_participant.track_publications.values():
            attributes["lk.transcribed_track_id"] = publication.sid
        return attributes

    async def _close_agent_segment(self) -> None:
        if self._agent_segment is not None:
            _, writer = self._agent_segment
            self._agent_segment = None
            await writer.aclose()

    def _later(self, write: Callable[[], Awaitable[Any]]) -> None:
        try:
            self._room_writes.put_nowait(write)
        except asyncio.QueueFull:
            self.dropped_room_writes += 1
            if self.dropped_room_writes == 1:
                log.warning("the room is not taking writes; dropping transcript and state updates")

    async def _write_to_room(self) -> None:
        while True:
            write = await self._room_writes.get()
            try:
                await write()
            except Exception as exc:  # a failed write (room closing) must not stop the next ones
                log.warning("room write failed: %s", exc)
            finally:
                self._room_writes.task_done()
