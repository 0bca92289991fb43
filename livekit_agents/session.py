"""One ``DuplexSession``: a conversation on our backend behind our call audio path.

Input goes through ``CallAudioPath.push_caller_frame`` (resampling, the onset VAD, edge
barge-in). Output is read out of the call path's playout by a drift-free 20 ms clock,
each frame stamped with ``start_ms`` on that clock; the gate is open exactly while a
frame carries a response's audio, and the response's words go out as transcript deltas
as their sound does, never after a cut.

Our edge's pause (caller sound over the agent) reaches the caller through AgentSession's room
output, which holds up to 200 ms in its ``AudioSource`` queue. So the pause pauses that output
too (``session.output.audio.pause()``), and the next few frames go at once: the output drops
its queue when a frame reaches it paused. While it stays paused only one frame in 100 ms is
handed over (what it gets plays after the resume, late by the pause; that one keeps the
adapter from ending the burst); the resume resumes it. The dropped
queue is skipped, not replayed (livekit-agents' own pause does the same): room_segment.py
keeps the heard text to where the skip began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from livekit import rtc
from livekit.agents import llm
from livekit.agents.llm.duplex import DuplexAudioFrame, DuplexOutputTranscriptDelta
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.session.ports import AdmissionError, Conversation
from duplex_agent.livekit_agents.agent_link import AgentSessionLink
from duplex_agent.livekit_agents.chat_items import item_events
from duplex_agent.livekit_agents.gate import ResponseGate
from duplex_agent.livekit_agents.heard_words import HeardWords
from duplex_agent.livekit_agents.model_calls import ModelCalls
from duplex_agent.livekit_agents.room_acks import RoomAckedConversation
from duplex_agent.livekit_agents.tool_reply import ToolReplies
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.webrtc.livekit.pcm import frame_samples
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.phone_callers import caller_turn_detection
from duplex_agent.webrtc.media.playout import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE

if TYPE_CHECKING:
    from livekit.agents import AgentSession

log = logging.getLogger("duplex_agent.livekit_agents")

FRAME_S = FRAME_MS / 1000.0
#: A clock this late (the loop stalled) starts a new schedule rather than burst out the backlog.
MAX_CLOCK_LAG_S = 0.2
#: Caller audio kept while the session opens (a model loading, a socket connecting), then fed in.
MAX_EARLY_INPUT_S = 30.0
#: Cut responses remembered (their late audio deltas carry no words worth keeping).
_CUT_KEPT = 64
#: Ticks between tries to find the AgentSession while none is found yet (once a second).
_LINK_EVERY_TICKS = 50
#: Frames handed over at once when the room output pauses: its byte stream passes audio on in
#: 50 ms frames, so three of ours surely get one to its forwarder, which then drops the queue.
ROOM_DROP_FRAMES = 3
#: While the room output is paused, a frame still goes to the adapter this long after the last:
#: it ends a burst after 0.8 s without one, and a stalled loop must not make a pause look like that.
ROOM_PAUSED_KEEPALIVE_S = 0.1


class DuplexBackendError(llm.RealtimeError):
    """A backend's error, with the wire's ``code`` (``backend_unavailable``, ``resource_exhausted``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ToolsUnsupportedError(DuplexBackendError):
    """The Agent has tools, and the backend's model cannot call them (the wire's ``tools_unsupported``)."""

    def __init__(self, plugin_id: str) -> None:
        super().__init__("tools_unsupported", f"the model {plugin_id!r} cannot call tools; give its Agent none, "
                         "or run a model that can (capabilities.supports_tools)")


@dataclass(frozen=True, slots=True)
class CutReply:
    """A reply cut short, as its session acknowledged it to the model."""

    response_id: str
    #: The words the caller heard (the ledger's text at the room's position): the history keeps these.
    heard: str
    #: All the model said of it before the cut, heard or not (its transcript).
    said: str
    #: How much of its audio the room output played.
    played_ms: float


class Backend(Protocol):
    async def open(self) -> Conversation: ...

    @property
    def known_capabilities(self) -> DuplexCapabilities | None:
        """The model's capabilities where known before a session opens, else None."""


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """What a ``DuplexModel`` gives each of its sessions."""

    backend: Backend
    overlap_policy: str = "barge_in"
    turn_detection: dict[str, Any] | None = None
    #: session.update fields sent as the conversation opens (the remote backend sends its own)
    opening_update: dict[str, Any] = field(default_factory=dict)
    #: sessions named with ``DuplexModel.attach``
    attached: Collection[AgentSession] = ()


class DuplexAgentSession(llm.DuplexSession):
    def __init__(self, model: llm.DuplexModel, plan: SessionPlan, *, gate: ResponseGate) -> None:
        super().__init__(model)
        self._plan = plan
        self._gate = gate
        self._tools = llm.ToolContext.empty()
        self._tool_schemas: list[dict[str, Any]] = []  # the tools as session.update carries them
        self._tool_choice: str | dict[str, Any] = "auto"  # the wire's default until the Agent says otherwise
        self._calls = ModelCalls()
        self._replies = ToolReplies(self._send, model_replies=self._model_replies_to_tools,
                                    turns_create_responses=_turns_create_responses(plan.turn_detection))
        self._instructions: str | None = None
        self._conversation: RoomAckedConversation | None = None
        self._path: CallAudioPath | None = None
        self._ready = asyncio.Event()  # the path is running (or the session failed to open)
        self._words = HeardWords()
        self._response_start_ms: dict[str, float] = {}  # response -> its first frame on our clock
        #: response -> where the adapter's later burst of it began on our clock: its words from
        #: then on start there at the earliest, or the adapter takes them for the earlier burst's
        self._burst_start_ms: dict[str, float] = {}
        self._cut: dict[str, None] = {}  # responses cut short, oldest first
        self._frame_response: str | None = None  # the response the last frame carried
        self._link = AgentSessionLink(self, response_of_burst=lambda: self._gate.open_for,
                                      on_room_played=self._room_played)
        #: Each reply cut short: what the caller heard of it (acknowledged to the model) and what it said.
        self.cut_replies: list[CutReply] = []
        self._said: dict[str, str] = {}  # response -> its transcript so far
        self._early_input: deque[rtc.AudioFrame] = deque()
        self._early_input_s = 0.0
        #: Seconds of caller audio AgentSession has pushed so far (0 until the room's track is read).
        self.caller_audio_s = 0.0
        self._resumes = 0
        self._room_paused = False  # AgentSession's audio output is paused, following our edge
        self._unpaced_ticks = 0  # frames still to hand over at once for the paused output to drop its queue
        self._closed_by_us = False
        #: The caller's turn detection: the model's ``session`` choice, or once the room's caller is
        #: known to be on a phone line (a SIP participant) and none was chosen, the phone line's.
        self.turn_detection = plan.turn_detection
        self._caller_line_known = False
        self._open_task = asyncio.create_task(self._open(), name="duplex-session-open")

    # ---- opening ----

    async def _open(self) -> None:
        await self._configured.wait()  # instructions go in the first update
        if self._closing:
            self._ready.set()
            return
        started = time.perf_counter()
        try:
            conversation = await self._plan.backend.open()
        except AdmissionError as exc:
            self._fail(exc.code, str(exc))
            self._ready.set()
            return
        except Exception as exc:  # the in-process model failed to load
            log.exception("the duplex backend failed to open a session")
            self._fail("model_unavailable", f"{type(exc).__name__}: {exc}")
            self._ready.set()
            return
        self._report_connection_acquired(time.perf_counter() - started)
        log.info("duplex session %s open (%.0f ms)", conversation.session_id, 1000.0 * (time.perf_counter() - started))
        self._conversation = RoomAckedConversation(conversation, on_audio_delta=self._on_audio_delta)
        linked = self._link.session
        self._conversation.room_attached = linked is not None and linked.output.audio is not None
        self._learn_caller_line()
        # No pause at a mere rise in the caller's level (knocks, coughs): here a false pause is not
        # free, the room output's dropped queue is skipped and the reply's later words leave history.
        path = CallAudioPath(self._conversation, overlap_policy=self._plan.overlap_policy,
                             turn_detection=self.turn_detection, pause_on_level=False,
                             on_event=self._on_event, on_closed=self._on_conversation_closed,
                             on_playout_cleared=self._on_playout_cleared)
        try:
            # the path drops what it is given before it has started (its VAD loads first, seconds
            # on a loaded machine), so the caller's audio is kept until then, and until what was
            # kept is fed in, in order: only then does push_audio feed the path itself
            await path.start()
            # after the path's own update, which fixes the input format the first update sets
            if self._plan.opening_update:
                self._conversation.send(p.SessionUpdate(session=dict(self._plan.opening_update)))
            if self._instructions:
                self._conversation.send(p.SessionUpdate(session={"instructions": self._instructions}))
            self._send_tools(conversation.capabilities)
            if not self._caller_line_known and self._learn_caller_line():
                path.update_session({"turn_detection": self.turn_detection})
            log.info("call audio path started: %.2f s of caller audio kept meanwhile, fed in order",
                     self._early_input_s)
            fed = 0
            while self._early_input:  # a little at a time
                frame = self._early_input.popleft()
                self._early_input_s -= frame.duration
                self._push(path, frame)
                fed += 1
                if fed % 5 == 0:
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            await path.close()
            raise
        self._path = path
        self._ready.set()

    def _fail(self, code: str, message: str, *, recoverable: bool = False) -> None:
        self._report(DuplexBackendError(code, message), recoverable=recoverable)

    def _report(self, error: DuplexBackendError, *, recoverable: bool) -> None:
        log.warning("duplex session error %s", error)
        self.emit("error", llm.RealtimeModelError(timestamp=time.time(), label=self.duplex_model.label,
                                                  error=error, recoverable=recoverable))

    def _send_tools(self, capabilities: DuplexCapabilities) -> None:
        """The tools given before the session opened, now that its model is known."""
        if self._tool_schemas and not capabilities.supports_tools:
            # an Agent written to act would otherwise talk on and never act: the session ends, saying why
            self._report(ToolsUnsupportedError(capabilities.plugin_id), recoverable=False)
            return
        update: dict[str, Any] = {"tools": self._tool_schemas} if self._tool_schemas else {}
        if self._tool_choice != "auto" and capabilities.supports_tools:
            update["tool_choice"] = self._tool_choice
        if update:
            self._send(p.SessionUpdate(session=update))

    # ---- DuplexSession ----

    @property
    def audio_stream(self) -> AsyncIterator[DuplexAudioFrame]:
        return self._frames()

    @property
    def tools(self) -> llm.ToolContext:
        return self._tools

    @property
    def conversation(self) -> Conversation | None:
        """The backend conversation (for apps that speak the wire themselves)."""
        return self._conversation.inner if self._conversation is not None else None

    def push_audio(self, frame: rtc.AudioFrame) -> None:
        self.caller_audio_s += frame.duration
        if self._path is not None:
            if not self._caller_line_known and self._learn_caller_line():
                self._path.update_session({"turn_detection": self.turn_detection})
            self._push(self._path, frame)
            self._follow_pause()  # the edge judges as the frame goes in: pause the room at once
        elif not self._ready.is_set():
            self._early_input.append(frame)
            self._early_input_s += frame.duration
            while self._early_input_s > MAX_EARLY_INPUT_S:
                self._early_input_s -= self._early_input.popleft().duration

    def _learn_caller_line(self) -> bool:
        """Whether the room's caller, now known, changed the caller's turn detection: the caller's
        first words are judged at the phone line's threshold where the room already links them as
        the session opens, and later ones where it links them later."""
        caller = self._link.linked_caller(self._plan.attached)
        if caller is None:
            self._caller_line_known = self._link.roomless  # else asked again at the next frame
            return False
        self._caller_line_known = True
        chosen = caller_turn_detection(caller.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP,
                                       self._plan.turn_detection)
        if chosen == self.turn_detection:
            return False
        log.info("caller %s is on a phone line: turn detection %s", caller.identity, chosen)
        self.turn_detection = chosen
        return True

    @staticmethod
    def _push(path: CallAudioPath, frame: rtc.AudioFrame) -> None:
        path.push_caller_frame(frame_samples(frame), frame.sample_rate)

    async def _update_instructions(self, instructions: str) -> None:
        self._instructions = instructions
        if self._conversation is not None:
            self._conversation.send(p.SessionUpdate(session={"instructions": instructions}))

    async def _append_items(self, items: list[llm.ChatItem]) -> None:
        batch = item_events(items, self._calls)
        if self._conversation is None:
            if batch.events:  # before the session opened: the model has no history to add to yet
                raise llm.RealtimeError("the duplex session has not opened yet; add items once it has")
            return
        for event in batch.events:
            self._conversation.send(event)
        self._replies.outputs_sent(batch.outputs_wanting_reply)

    def _model_capabilities(self) -> DuplexCapabilities | None:
        if self._conversation is not None:
            return self._conversation.capabilities
        return self._plan.backend.known_capabilities

    def _model_replies_to_tools(self) -> bool:
        capabilities = self._model_capabilities()
        return capabilities is not None and capabilities.replies_to_tool_output

    def _send(self, event: p.ClientEvent) -> None:
        if self._conversation is not None:
            self._conversation.send(event)

    async def _update_tools(self, tools: list[llm.Tool]) -> None:
        context = llm.ToolContext(tools)
        # livekit-agents' own schema builder, in the flat shape the realtime wire carries
        schemas = context.parse_function_tools("openai.responses")
        capabilities = self._model_capabilities()
        if schemas and capabilities is not None and not capabilities.supports_tools:
            raise ToolsUnsupportedError(capabilities.plugin_id)
        had_tools = bool(self._tool_schemas)
        self._tools, self._tool_schemas = context, schemas
        if self._conversation is not None and (schemas or had_tools):
            self._conversation.send(p.SessionUpdate(session={"tools": schemas}))

    def _update_options(self, *, tool_choice: NotGivenOr[llm.ToolChoice | None] = NOT_GIVEN) -> None:
        if not is_given(tool_choice):
            return
        choice = _wire_tool_choice(tool_choice)
        capabilities = self._model_capabilities()
        can_call = capabilities is None or capabilities.supports_tools
        if choice not in ("auto", "none") and not can_call:
            assert capabilities is not None
            raise ToolsUnsupportedError(capabilities.plugin_id)
        # the framework sets it around every tool reply and back: only a change goes out
        changed, self._tool_choice = choice != self._tool_choice, choice
        if self._conversation is not None and can_call and changed:
            self._conversation.send(p.SessionUpdate(session={"tool_choice": choice}))

    def _generate_reply(self, *, instructions: NotGivenOr[str] = NOT_GIVEN,
                        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
                        tools: NotGivenOr[list[llm.Tool]] = NOT_GIVEN) -> None:
        # per-response tools and tool_choice are not taken (per_response_tool_choice is False):
        # the framework sets them on the session first
        self._replies.ask(instructions if is_given(instructions) else None)

    async def aclose(self) -> None:
        await super().aclose()
        self._closed_by_us = True
        self._open_task.cancel()
        await asyncio.gather(self._open_task, return_exceptions=True)
        path, self._path = self._path, None
        if path is not None:
            await path.close()
        if self._conversation is not None:
            await self._conversation.close("client_closed")

    # ---- the output clock ----

    async def _frames(self) -> AsyncIterator[DuplexAudioFrame]:
        """The playout read out on a fixed schedule: frame n is due n * 20 ms after the start."""
        await self._ready.wait()
        loop = asyncio.get_running_loop()
        origin, tick = loop.time(), 0
        handed_at = origin  # when the last frame went to the adapter
        timeline_ms = 0.0  # the model's timeline: 20 ms per frame, across schedule restarts
        while self._path is not None:
            unpaced = self._unpaced_ticks > 0
            if unpaced:
                self._unpaced_ticks -= 1
            else:
                delay = origin + tick * FRAME_S - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -MAX_CLOCK_LAG_S:
                    origin, tick = loop.time(), 0
            path = self._path
            if path is None:
                return
            pcm = path.next_frame()
            self._watch_resumes()
            self._follow_pause()
            tick += 1
            timeline_ms += FRAME_MS
            if self._room_paused and not unpaced and not self._unpaced_ticks \
                    and loop.time() - handed_at < ROOM_PAUSED_KEEPALIVE_S:
                continue  # the paused room output has dropped its queue; this would play after the resume
            handed_at = loop.time()
            # a response holds the gate from its first frame to its last, underruns included
            response = path.playout.current_response_id or (self._frame_response if path.playout.playing else None)
            if self._link.session is None and tick % _LINK_EVERY_TICKS == 0:
                self.link_session()
            for frame in self._frames_for(pcm, response, timeline_ms - FRAME_MS):
                yield frame
            if response is not None:  # after the adapter has opened the frame's burst
                if self._link.reopened == response:  # it ended an earlier burst of it (agent_link.py)
                    self._link.reopened = None
                    # just past that burst's end: the adapter's test for a word too late for it is "<="
                    self._burst_start_ms[response] = timeline_ms - FRAME_MS + 1.0
                self._link.frame_handed(response, FRAME_S, path.playout.played_ms(response))
                self._emit_heard(response)

    def _frames_for(self, pcm: np.ndarray, response: str | None, start_ms: float) -> list[DuplexAudioFrame]:
        frames: list[DuplexAudioFrame] = []
        previous = self._frame_response
        if previous is not None and previous != response:
            # played out: all its words were heard (a cut one says no more)
            self._emit_heard(previous, to_the_end=True)
            if self._link.session is None:  # no room output will report on it
                self._forget(previous)
        if response is not None and previous not in (None, response):
            # two responses back to back: a closed frame between them makes them two bursts
            self._gate.open_for = None
            frames.append(DuplexAudioFrame(_silence(), start_ms=int(start_ms)))
        if response is not None and response not in self._response_start_ms:
            self._response_start_ms[response] = start_ms
            if self._link.session is None:
                self.link_session()
            # where a reply the caller never heard got to: its first frame left for the adapter
            log.debug("response %s: its first frame goes to AgentSession (linked: %s)", response,
                      self._link.session is not None)
        self._gate.open_for = response
        self._frame_response = response
        frame = rtc.AudioFrame(pcm.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES)
        frames.append(DuplexAudioFrame(frame, start_ms=int(start_ms)))
        return frames

    def _emit_heard(self, response_id: str, *, to_the_end: bool = False) -> None:
        path = self._path
        if path is None or response_id in self._cut:
            return
        origin = self._response_start_ms.get(response_id, 0.0)
        burst_start = self._burst_start_ms.get(response_id, 0.0)
        heard = self._words.take_rest(response_id) if to_the_end else \
            self._words.take_heard(response_id, path.playout.played_ms(response_id))
        for word in heard:
            start = max(origin + word.start_ms, burst_start)
            self.emit("transcript_delta", DuplexOutputTranscriptDelta(
                text=word.text + " ", start_ms=int(start), end_ms=int(max(origin + word.end_ms, start))))

    # ---- the AgentSession ----

    def link_session(self) -> Any:
        """The AgentSession this session runs in, connected on first sight (None until it is found)."""
        if self._link.session is None:
            session = self._link.find(self._plan.attached)
            if session is not None:
                log.info("duplex session linked to its AgentSession: edge barge-in interrupts it")
                self._link.connect(session)
                if self._conversation is not None:
                    self._conversation.room_attached = session.output.audio is not None
        return self._link.session

    def _follow_pause(self) -> None:
        """AgentSession's audio output pauses and resumes with our edge's playout."""
        path = self._path
        paused = path is not None and path.playout.paused
        if paused == self._room_paused:
            return
        if paused:
            self._room_paused = self._link.pause_output()
            if self._room_paused:
                self._unpaced_ticks = ROOM_DROP_FRAMES
        else:  # resumed, or cleared by a cut AgentSession did not take
            self._room_paused = False
            self._unpaced_ticks = 0
            self._link.resume_output()

    def _on_playout_cleared(self) -> None:
        """Our edge (or the model) stopped the agent: nothing more of it is heard or said."""
        if self._frame_response is not None:
            self._cut_response(self._frame_response)

    def _cut_response(self, response_id: str) -> None:
        self._cut[response_id] = None
        while len(self._cut) > _CUT_KEPT:
            del self._cut[next(iter(self._cut))]
        if self.link_session() is not None and self._plan.overlap_policy != "listen" and self._link.interrupt():
            # a paused output stays paused: the interrupt clears it, and AgentSession resumes it
            # before the next reply's audio (resumed now, it would play what it holds first)
            self._room_paused = False
            self._unpaced_ticks = 0

    def _room_played(self, response_id: str, played_ms: float, interrupted: bool, burst_from_ms: float) -> str | None:
        """The room output finished a response (its burst from ``burst_from_ms`` of it on): ack
        at its position; for a cut one, the heard text of that burst."""
        if self._conversation is not None:
            self._conversation.room_played(response_id, played_ms)
        if self._path is not None:  # as the ack says: the room cannot have played more than we handed it
            played_ms = min(played_ms, self._path.playout.played_ms(response_id))
        heard = None
        if interrupted or response_id in self._cut:
            heard = self._words.heard_text(response_id, played_ms)
            self.cut_replies.append(CutReply(response_id, heard, self._said.get(response_id, ""), played_ms))
            del self.cut_replies[:-_CUT_KEPT]
            # the bursts before it hold the words before (agent_link.py)
            heard = heard[len(self._words.heard_text(response_id, burst_from_ms)):].lstrip()
        self._forget(response_id)
        return heard

    def _forget(self, response_id: str) -> None:
        self._words.forget(response_id)
        self._response_start_ms.pop(response_id, None)
        self._burst_start_ms.pop(response_id, None)
        self._said.pop(response_id, None)

    # ---- the conversation's events ----

    def _on_audio_delta(self, event: p.ResponseAudioDelta) -> None:
        if event.response_id not in self._cut:
            self._words.add_marks(event.response_id, event.marks)

    def _on_event(self, event: p.ServerEvent) -> None:
        if log.isEnabledFor(logging.DEBUG) and not isinstance(event, (p.ResponseTranscriptDelta, p.ResponseAudioDelta)):
            # the turn's course, for a reader of a turn that never got its reply (deltas left out)
            log.debug("model event %s%s", event.type, _event_detail(event))
        call = self._calls.take(event)
        if call is not None:
            self.emit("function_call", call)
        self._replies.on_event(event)
        if isinstance(event, p.ResponseTranscriptDelta):
            if event.response_id not in self._cut:
                self._said[event.response_id] = self._said.get(event.response_id, "") + event.delta
        elif isinstance(event, p.SpeechStarted):
            self.emit("input_speech_started", llm.InputSpeechStartedEvent())
        elif isinstance(event, p.SpeechStopped):
            self.emit("input_speech_stopped", llm.InputSpeechStoppedEvent(
                user_transcription_enabled=self.capabilities.user_transcription))
        elif isinstance(event, p.InputTranscriptionCompleted):
            self.emit("input_audio_transcription_completed", llm.InputTranscriptionCompleted(
                item_id=event.item_id, transcript=event.transcript, is_final=True))
        elif isinstance(event, p.ResponseDone) and event.status != "completed" \
                and event.response_id == self._frame_response and event.response_id not in self._cut:
            # the model ended the response while its audio paused (nothing queued to clear)
            self._cut_response(event.response_id)
        elif isinstance(event, p.ErrorEvent):
            self._fail(event.code, str(event.error.get("message", "")), recoverable=True)

    def _on_conversation_closed(self) -> None:
        if not self._closed_by_us and not self._closing:
            self._fail("session_closed", "the duplex backend closed the session")

    def _watch_resumes(self) -> None:
        conversation = self._conversation
        resumes = getattr(conversation.inner, "resumes", 0) if conversation is not None else 0
        if resumes > self._resumes:
            self._resumes = resumes
            self.emit("session_reconnected", llm.RealtimeSessionReconnectedEvent())


def _turns_create_responses(turn_detection: dict[str, Any] | None) -> bool:
    """Whether the end of a caller's turn makes the model respond without being asked (server VAD's default)."""
    if turn_detection is None:
        return True  # the call path's default, server VAD
    return turn_detection.get("type") is not None and bool(turn_detection.get("create_response", True))


def _wire_tool_choice(choice: llm.ToolChoice | None) -> str | dict[str, Any]:
    """livekit-agents' ``{"type": "function", "function": {"name": ...}}`` is the wire's ``{"type", "name"}``;
    its None (no preference) is the wire's default, ``auto``."""
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return "auto" if choice is None else choice


def _silence() -> rtc.AudioFrame:
    return rtc.AudioFrame(bytes(2 * FRAME_SAMPLES), SAMPLE_RATE, 1, FRAME_SAMPLES)


def _event_detail(event: p.ServerEvent) -> str:
    """A few identifying fields of ``event`` for its debug line."""
    fields = ("response_id", "item_id", "call_id", "status", "code", "transcript", "reason")
    shown = {name: getattr(event, name) for name in fields if getattr(event, name, None) not in (None, "")}
    return f" {shown}" if shown else ""
