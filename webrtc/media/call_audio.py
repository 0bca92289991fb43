"""One call's audio between a transport and a duplex conversation.

Transport-neutral: the aiortc peer and the LiveKit room both feed caller frames
in with ``push_caller_frame`` and pull paced 20 ms frames out with ``next_frame``.

Caller side: resample to the model's input rate and append; score each 32 ms VAD
window at the edge (while the agent speaks on two grids, a window ending every 16 ms: onset.py), and on caller sound over agent audio (overlap policy "barge_in")
pause the playout at the first rise in the caller's level (level_onset.py) or the first window
over the pause threshold, then, once the speech holds
(the minimum speech), clear it, cancel the response and acknowledge what was heard, or,
if it does not hold, resume where it paused (barge_in.py says which).
Agent side: audio deltas go to the call's ``AgentAudioOutput`` (agent_output.py: resample,
jitter hold, playout), whose end of each response becomes its ``PlaybackAck``; other
events pass on. With tools (``tools``), the session.update at start declares them, and the
call's ``EdgeToolRunner`` (agent/tools/edge_runner.py) sees every event and every playback end
and runs the model's calls; its hold sound plays where the agent is silent. The timings the caller hears (barge-in, turn, false pause) are kept by
call_figures.py from the frames that go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from duplex_agent.agent.metrics import (
    BARGE_IN_FALSE_PAUSES,
    BARGE_IN_LEVEL_PAUSES,
    BARGE_IN_PAUSES,
    BARGE_IN_PAUSES_WITHHELD,
    BARGE_INS_CONFIRMED,
    FIGURE_DEFINITIONS,
)
from duplex_agent.agent.models.vad import SileroVadModel, VadSettings, VadSettingsError, release_threshold
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.agent.protocol.events import (
    InputAudioBufferAppend,
    OutputAudioBufferCleared,
    PlaybackAck,
    ProtocolError,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionUpdate,
    SpeechStarted,
    SpeechStopped,
)
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.agent.tools.edge_runner import EdgeToolRunner, RunnerTools
from duplex_agent.plugins.contract.say import RESPONSE_SAY
from duplex_agent.webrtc.media.agent_output import RESAMPLE_QUALITY, AgentAudioOutput, PlaybackEnded
from duplex_agent.webrtc.media.barge_in import BargeInGate, BargeInRules, Verdict, pause_threshold
from duplex_agent.webrtc.media.call_figures import CallTimings
from duplex_agent.webrtc.media.echo_canceller import EchoCanceller
from duplex_agent.webrtc.media.echo_canceller import available as echo_canceller_available
from duplex_agent.webrtc.media.hold_sound import HoldSound
from duplex_agent.webrtc.media.latency import LatencyFigures
from duplex_agent.webrtc.media.level_onset import LevelOnset
from duplex_agent.webrtc.media.onset import CallerOnsetDetector
from duplex_agent.webrtc.media.playout import SAMPLE_RATE, ChunkStarted, PlayoutQueue
from duplex_agent.webrtc.media.said_texts import SaidTexts

logger = logging.getLogger("duplex_agent.webrtc")

OVERLAP_POLICIES = ("barge_in", "listen")
#: The most a continuous model's response is held back before its playout starts (a jitter buffer).
MAX_JITTER_MS = 100.0
#: session.update fields a page may set over the data channel, with their types.
PAGE_SESSION_FIELDS: dict[str, tuple[type, ...]] = {
    "instructions": (str,),
    "voice": (str, type(None)),
    "overlap_policy": (str,),
    "turn_detection": (dict,),  # server VAD and end-of-turn settings; the session validates them
}
#: The figures the page shows (app.js, "metrics"): a metrics message is worth sending
#: only when one of these changed. input_added_ms changes every frame and is not one.
PAGE_FIGURES = ("turn_ms", "barge_in_ms")
#: What the agent is doing, as the page shows it.
AGENT_STATES = ("listening", "thinking", "speaking")

EventCallback = Callable[[ServerEvent], None]
StateCallback = Callable[[str], None]


def validate_page_session(settings: Any) -> dict[str, Any]:
    """The page's session settings, checked; ProtocolError naming the first bad field."""
    if not isinstance(settings, dict):
        raise ProtocolError("invalid_field", "session must be an object")
    for key, value in settings.items():
        expected = PAGE_SESSION_FIELDS.get(key)
        if expected is None:
            raise ProtocolError("unknown_session_field", f"session field {key!r} cannot be set from the page")
        if not isinstance(value, expected):
            raise ProtocolError("invalid_field", f"session field {key!r} has the wrong type")
    if settings.get("overlap_policy", "barge_in") not in OVERLAP_POLICIES:
        raise ProtocolError("invalid_field", f"overlap_policy must be one of {list(OVERLAP_POLICIES)}")
    return dict(settings)


class CallAudioPath:
    def __init__(
        self,
        conversation: Conversation,
        *,
        overlap_policy: str = "barge_in",
        turn_detection: dict[str, Any] | None = None,
        vad_model: SileroVadModel | None = None,
        pause_on_level: bool = True,  # False: only the VAD's windows pause, not a rise in the caller's level
        barge_in_min_speech_ms: float | None = None,  # None: turn_detection's min_speech_ms
        barge_in_pause_threshold: float | None = None,  # None: pause_threshold(turn_detection's threshold)
        append_ms: float = 10.0,  # smallest append; a 20 ms caller frame goes out at once
        on_event: EventCallback | None = None,
        on_state: StateCallback | None = None,
        on_closed: Callable[[], None] | None = None,
        on_playout_cleared: Callable[[], None] | None = None,
        on_paused: Callable[[PlayoutQueue], object] | None = None,  # a transport's own queue empties now
        on_cut_short: Callable[[str, str], None] | None = None,
        playout: PlayoutQueue | None = None,  # the output's queue (a bench passes a timed one)
        figures: LatencyFigures | None = None,  # the call's recent figures (a bench keeps them all)
        tools: RunnerTools | None = None,  # the call's tools (ToolBox.for_call): run at the edge
        echo_cancel: bool = False,  # cancel the agent's echo in the caller's audio (echo_canceller.py; the transports' default)
    ) -> None:
        if overlap_policy not in OVERLAP_POLICIES:
            raise ValueError(f"overlap_policy must be one of {OVERLAP_POLICIES}")
        self._conversation = conversation
        self._caps = conversation.capabilities
        self.overlap_policy = overlap_policy
        self._turn_detection = turn_detection if turn_detection is not None else {"type": "server_vad"}
        self._vad_model = vad_model
        self._onset: CallerOnsetDetector | None = None
        self._pause_on_level = pause_on_level
        self._level = LevelOnset()
        self.echo: EchoCanceller | None = None
        if echo_cancel and echo_canceller_available():
            self.echo = EchoCanceller()
        elif echo_cancel:
            logger.warning("echo cancelling needs the livekit package (the livekit extra): this call has none")
        self._barge_in_min_speech_ms = barge_in_min_speech_ms
        self._barge_in_pause_threshold = barge_in_pause_threshold
        self.gate = BargeInGate(self._barge_in_rules())
        self._on_event = on_event
        self._on_state = on_state
        self._on_closed = on_closed
        self._on_paused = on_paused
        # (response id, the words the caller heard) for a reply cut short, once its ack is out.
        self._on_cut_short = on_cut_short

        # A frame-synchronous model (continuous input, 40 ms or longer units) sends one unit per
        # tick of its own clock; playout starts a response one unit late (at most MAX_JITTER_MS,
        # so a 1 s unit does not hold a reply back for a second), so that the jitter of that clock
        # against the caller's 20 ms pacing does not run the queue dry.
        continuous = self._caps.input_mode == "continuous" and self._caps.unit_ms >= 40.0
        self.output = AgentAudioOutput(
            on_playback_finished=self._playback_ended,
            on_cleared=on_playout_cleared,
            jitter_ms=min(self._caps.unit_ms, MAX_JITTER_MS) if continuous else 0.0,
            playout=playout,
        )
        self._tool_set = tools if tools is not None and self._caps.supports_tools else None
        if tools is not None and self._tool_set is None:
            logger.warning("the model %r cannot call tools: this call has none", self._caps.plugin_id)
        self.hold: HoldSound | None = None
        self.tools: EdgeToolRunner | None = None
        if self._tool_set is not None:
            self.hold = HoldSound(on_start=self.output.playout.wake)
            self.tools = EdgeToolRunner(self._tool_set, conversation.send, hold=self.hold,
                                        replies_to_tool_output=self._caps.replies_to_tool_output)
        self._said = SaidTexts()
        self.figures = figures if figures is not None else LatencyFigures()
        self._timings = CallTimings(self.figures)
        self._events_task: asyncio.Task[None] | None = None
        self._closed = False

        # caller -> model
        self._input_resampler: StreamingResampler | None = None
        self._append_samples = max(1, round(append_ms * self._caps.input_sample_rate / 1000.0))
        self._pending_input: list[np.ndarray] = []
        self._pending_samples = 0
        self._input_received_ms = 0.0  # caller audio pushed so far
        self._input_sent_ms = 0.0  # model-rate audio appended so far

        self.barge_ins = 0
        self.pauses = 0
        self.level_pauses = 0  # of the pauses, those a rise in the caller's level made
        self.false_pauses = 0
        self.pauses_withheld = 0
        self.state = "listening"

    @property
    def playout(self) -> PlayoutQueue:
        """The output's playout queue, for transports that read its state."""
        return self.output.playout

    # ---- lifecycle ----

    async def start(self) -> None:
        """Load the VAD (off the loop), configure the session, start consuming events."""
        if self._vad_model is None:
            self._vad_model = await asyncio.to_thread(SileroVadModel.shared)
        self._onset = CallerOnsetDetector(self._vad_model)
        self._conversation.use_caller_vad(self._onset.scores)  # an in-process session's turn detection
        session: dict[str, Any] = {
            "input_audio_format": "pcm_f32le",
            "input_sample_rate": self._caps.input_sample_rate,
            "turn_detection": self._turn_detection,
            "overlap_policy": self.overlap_policy,
        }
        if self._tool_set is not None:
            session["tools"] = self._tool_set.schemas
            if self._tool_set.instructions:
                session["instructions"] = self._tool_set.instructions
        self._conversation.send(SessionUpdate(session=session))
        self._events_task = asyncio.create_task(self._consume_events(), name="call-audio-events")

    async def say(self, text: str) -> bool:
        """Has the model say ``text`` word for word (a model with ``speaks_given_text``); True once
        the caller has heard it to its end, False if it was refused, cut short or the call ended."""
        event_id, heard = self._said.ask(text)
        self._conversation.send(ResponseCreate(event_id=event_id, response={RESPONSE_SAY: text}))
        return await heard

    async def close(self) -> None:
        """Stop consuming events; the conversation itself belongs to the caller."""
        self._closed = True
        self._said.close()
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._events_task
            self._events_task = None
        if self.tools is not None:
            await self.tools.close()
        self.output.playout.clear()

    def update_session(self, settings: Any) -> None:
        """Apply the page's session settings (a session.update subset); ProtocolError when bad."""
        settings = validate_page_session(settings)
        if "overlap_policy" in settings:
            self.overlap_policy = settings["overlap_policy"]
            if not self._barges_in():
                self._resume()
        if "turn_detection" in settings:
            self._turn_detection = settings["turn_detection"]
            self.gate.rules = self._barge_in_rules()
        if settings.get("instructions") and self._tool_set is not None and self._tool_set.instructions:
            # The page's instructions come first; what the tools need said stays.
            settings["instructions"] = f"{settings['instructions']}\n\n{self._tool_set.instructions}"
        if settings:
            self._conversation.send(SessionUpdate(session=settings))

    # ---- caller -> model ----

    def push_caller_frame(self, samples: np.ndarray, sample_rate: int) -> None:
        """Mono float32 caller audio at any rate (typically 20 ms at 48 kHz)."""
        if self._closed or self._onset is None:
            return
        arrived_at = time.perf_counter()
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.echo is not None:
            samples = self.echo.near_end(samples, sample_rate)
        pausable = self.gate.rules.pause and self._barges_in() and self._mid_reply()
        for window in self._onset.push(samples, sample_rate, arrived_at, half_step=pausable):
            self._judge(window.probability, window.arrived_at, half_step=window.half_step, level_db=window.level_db)
        # After the frame's windows: those that ended before the sound began are not its to judge.
        if self._pause_on_level and self._level.push(samples, sample_rate) and pausable:
            pauses = self.pauses
            self._act_on(self.gate.push_level_onset(at=arrived_at, agent_playing=True,
                                                    reply=self.playout.current_response_id), arrived_at)
            if self.pauses > pauses:
                self.level_pauses += 1
                BARGE_IN_LEVEL_PAUSES.inc()

        if self._input_resampler is None or self._input_resampler.in_rate != sample_rate:
            self._input_resampler = StreamingResampler(sample_rate, self._caps.input_sample_rate, quality=RESAMPLE_QUALITY)
        self._input_received_ms += 1000.0 * samples.size / sample_rate
        resampled = self._input_resampler.process(samples)
        if resampled.size:
            self._pending_input.append(resampled)
            self._pending_samples += resampled.size
        if self._pending_samples >= self._append_samples:
            chunk = np.concatenate(self._pending_input)
            self._pending_input.clear()
            self._pending_samples = 0
            self._conversation.send(InputAudioBufferAppend(audio=chunk, sample_rate_hz=self._caps.input_sample_rate))
            self._input_sent_ms += 1000.0 * chunk.size / self._caps.input_sample_rate
            # Work time plus caller audio received but not yet handed on (resampler, chunking).
            held_ms = max(0.0, self._input_received_ms - self._input_sent_ms)
            self.figures.record("input_added_ms", 1000.0 * (time.perf_counter() - arrived_at) + held_ms)

    def _barges_in(self) -> bool:
        return self.overlap_policy == "barge_in" and self._caps.supports_barge_in

    def _barge_in_rules(self) -> BargeInRules:
        """The gate's rules are the session VAD's (threshold and its hysteresis, minimum speech)
        over the onset detector's windows, so the edge confirms a barge-in where the session's own
        turn detection would see the speech start; it pauses on weaker windows (barge_in.py). The
        silence that ends the caller's speech over the agent stays the gate's own, shorter than the
        session's end-of-turn silence: a caller who stops and speaks again over a new reply barges
        in again."""
        try:
            vad = VadSettings.from_dict(self._turn_detection or {})
        except VadSettingsError:  # the session refuses it with a typed error; keep the defaults here
            vad = VadSettings()
        min_speech, pause_at = self._barge_in_min_speech_ms, self._barge_in_pause_threshold
        return BargeInRules(
            threshold=vad.threshold,
            pause_threshold=pause_threshold(vad.threshold) if pause_at is None else pause_at,
            release_threshold=release_threshold(vad.threshold),
            min_speech_ms=float(vad.min_speech_ms if min_speech is None else min_speech),
            level_onset=self._pause_on_level,
        )

    def _judge(self, probability: float, window_at: float, *, half_step: bool, level_db: float | None) -> None:
        """One VAD window of caller audio: pause, resume or barge in (barge_in.py)."""
        playing = self._barges_in() and self._mid_reply()
        verdict = self.gate.push(probability, at=window_at, agent_playing=playing,
                                 reply=self.playout.current_response_id, half_step=half_step, level_db=level_db)
        self._act_on(verdict, window_at)

    def _act_on(self, verdict: Verdict | None, at: float) -> None:
        """Carry out the gate's verdict on caller sound that arrived ``at``."""
        if verdict is Verdict.PAUSE:
            if self.output.pause():
                self.pauses += 1
                BARGE_IN_PAUSES.inc()
                self._timings.forget_pause_heard()
                if self._on_paused is not None:
                    self._on_paused(self.playout)
            else:
                self.gate.release()
        elif verdict is Verdict.RESUME:
            self._resume()
        elif verdict is Verdict.WITHHELD:
            self.pauses_withheld += 1
            BARGE_IN_PAUSES_WITHHELD.inc()
        elif verdict is Verdict.CONFIRM:
            paused_at = self._timings.take_pause_heard_at()
            if self._barges_in() and (self._mid_reply() or self.playout.paused):
                self._barge_in(self.gate.onset_at or at, silent_at=paused_at)

    def _mid_reply(self) -> bool:
        """The agent's audio plays, or a reply that has started playing waits for its next audio
        (an underrun: a frame-synchronous model late on a loaded CPU). Caller sound in such a gap
        is over the agent too; judged as the caller's own turn, it could never cut the reply."""
        return self.playout.playing or self.playout.current_response_id is not None

    def _resume(self) -> None:
        """Go on with the paused reply; the pause's length is recorded when it is heard to end."""
        self.gate.release()
        self._timings.forget_pause_heard()
        if self.output.resume():
            self.false_pauses += 1
            BARGE_IN_FALSE_PAUSES.inc()

    def _barge_in(self, onset_at: float, *, silent_at: float | None = None) -> None:
        """Silence now (already, when a pause went out at ``silent_at``), then cancel, then
        tell the model what the caller heard."""
        current = self.playout.current_response_id
        responses = self.output.interrupt()
        self._timings.barge_in(onset_at, silent_at=silent_at)
        self.barge_ins += 1
        BARGE_INS_CONFIRMED.inc()
        if current is not None:
            self._conversation.send(ResponseCancel(response_id=current, reason="barge_in"))
        for response_id in responses:
            self.output.acknowledge(response_id)
        self._set_state("listening")

    # ---- model -> caller ----

    async def _consume_events(self) -> None:
        try:
            async for event in self._conversation.events():
                try:
                    self._handle_event(event)
                except ProtocolError as exc:
                    logger.warning("dropping bad %s from the conversation: %s", event.type, exc)
                if self.tools is not None:  # after the playout has taken the event in
                    self.tools.observe(event)
        except Exception:
            logger.exception("conversation event stream failed")
        if self._on_closed is not None:
            self._on_closed()

    def _handle_event(self, event: ServerEvent) -> None:
        if isinstance(event, ResponseAudioDelta):
            self.output.capture_frame(event)
            return
        if isinstance(event, ResponseAudioDone):
            self.output.flush(event.response_id)
        elif isinstance(event, ResponseDone):
            if event.status == "cancelled":
                self._drop_response(event.response_id)
            else:
                self.output.flush(event.response_id)
            if self.state == "thinking" and not self.playout.playing:
                self._set_state("listening")
        elif isinstance(event, OutputAudioBufferCleared):
            if event.response_id is None:
                self.output.clear_buffer()
                self.gate.release()
            else:
                self._drop_response(event.response_id)
            self._set_state("listening")
        elif isinstance(event, SpeechStopped):
            # audio_end_ms is on the input timeline the onset detector keeps (ms of caller audio).
            self._timings.speech_ended(self._onset.arrivals.arrival_of(event.audio_end_ms) if self._onset else None)
            if not self.playout.playing:
                self._set_state("thinking")
        elif isinstance(event, SpeechStarted):
            if not self.playout.playing:
                self._set_state("listening")
        elif isinstance(event, ResponseCreated) and not self.playout.playing:
            self._set_state("thinking")
        self._said.observe(event)
        if self._on_event is not None:
            self._on_event(event)

    def _drop_response(self, response_id: str) -> None:
        self.output.drop(response_id)
        if not self.playout.paused:
            self.gate.release()

    def _playback_ended(self, ended: PlaybackEnded) -> None:
        """The output is done with a response: tell the model what the caller heard."""
        self._conversation.send(PlaybackAck(response_id=ended.response_id, played_ms=ended.playback_position_ms))
        if self.tools is not None:
            self.tools.playback_ended(ended.response_id, interrupted=ended.interrupted)
        self._said.playback_ended(ended.response_id, interrupted=ended.interrupted)
        if ended.heard_text is not None and self._on_cut_short is not None:
            self._on_cut_short(ended.response_id, ended.heard_text)

    # ---- pacing side ----

    def next_frame(self) -> np.ndarray:
        """The next 20 ms for the caller (int16, 960 samples at 48 kHz)."""
        frame, progress_made = self.output.next_frame()
        if self.hold is not None and self.hold.sounding and not self.playout.playing:
            # Only in the agent's silence; the figures go by the playout's progress, so it is no reply.
            frame = self.hold.next_frame()
        self._timings.frame_out(progress_made, time.perf_counter())
        if self.echo is not None:
            self.echo.far_end(frame, SAMPLE_RATE)
        for progress in progress_made:
            if isinstance(progress, ChunkStarted):  # also after an underrun mid-reply, which said "listening"
                self._set_state("speaking")
        # Listening once the reply has played out, not in a gap while more of it is still coming.
        if self.state == "speaking" and not self.playout.playing and not self.output.receiving:
            self._set_state("listening")
        return frame

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        if self._on_state is not None:
            self._on_state(state)

    @property
    def hold_sounding(self) -> bool:
        """The hold sound plays (a transport that waits for audio sends frames meanwhile)."""
        return self.hold is not None and self.hold.sounding

    def page_figures(self) -> tuple[Any, ...]:
        """What the page shows of this call's figures (compare two to see if the page would change)."""
        return tuple((len(self.figures.recent(name)), self.figures.last(name)) for name in PAGE_FIGURES)

    def figures_message(self) -> dict[str, Any]:
        """The ``metrics`` message for the page."""
        return {
            "type": "metrics",
            "latency": self.figures.snapshot(),
            "definitions": FIGURE_DEFINITIONS,
            "barge_ins": self.barge_ins,
            "false_pauses": self.false_pauses,
            "level_pauses": self.level_pauses,
            "underruns": self.playout.underruns,
            "queued_ms": round(self.playout.queued_ms, 1),
        }
