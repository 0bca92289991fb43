"""The session runner: one per conversation, one ordered mailbox.

Typed client events go in through ``send``; typed server events come out of
``events``. The runner owns the conversation's clock of epochs: every cancel,
clear and barge-in advances the epoch, every piece of work captures the fence
it started under, and results of an older epoch are dropped.

Data flow of one append: decode -> resample to the model rate -> VAD ->
overlap policy -> append buffer (whole units) -> plugin plan -> engine submit.
Stage outputs flow back through the plugin's decisions and data plane into
events, and the playback ledger keeps what the caller heard.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duplex_agent.agent.models.vad import SileroVadModel, VadSettings, VadStream
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.agent.protocol.session_config import apply_session_update, session_config_dict
from duplex_agent.agent.session.ledger import ResponseLedger, TextMark
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.silence import SilenceContinuation, SilenceTick
from duplex_agent.plugins.contract import (
    DuplexAppendPlan,
    DuplexCapabilities,
    DuplexFence,
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexRuntimeConfigError,
    DuplexSessionConfig,
    PartialStageForward,
    PcmAppendReservation,
)
from duplex_agent.plugins.contract.engine import DuplexEngine, EngineSubmitError, StageOutput

log = logging.getLogger("duplex_agent.runner")
_CLOSE = object()
DTMF_DIGITS = frozenset("0123456789*#ABCD")


class AppendFailed(RuntimeError):
    pass


@dataclass(slots=True)
class HistoryItem:
    item_id: str
    role: str
    text: str = ""
    ledger: ResponseLedger | None = None
    committed_to_model: bool = False

    @property
    def heard_text(self) -> str:
        return self.ledger.heard_text() if self.ledger is not None else self.text


@dataclass(slots=True)
class ActiveResponse:
    response_id: str
    item_id: str
    turn_id: int
    fence: DuplexFence
    ledger: ResponseLedger
    request_ids: set[str] = field(default_factory=set)
    spoke: bool = False
    audio_done: bool = False


@dataclass(slots=True)
class _StageStream:
    """Runner-side state of one stage request."""

    request_id: str
    stage_id: int
    fence: DuplexFence
    turn_id: int
    response: ActiveResponse | None
    req_state: dict[str, Any] = field(default_factory=dict)
    forwarded_partial: bool = False


class DuplexSessionRunner:
    def __init__(
        self,
        plugin: DuplexModelPlugin,
        engine: DuplexEngine,
        capabilities: DuplexCapabilities,
        *,
        limits: SessionLimits | None = None,
        vad_model: SileroVadModel | None = None,
        session_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_close: Callable[[DuplexSessionRunner], None] | None = None,
    ) -> None:
        self._session_id = session_id or f"sess_{uuid.uuid4().hex[:12]}"
        if "-" in self._session_id:
            raise ValueError("a session id may not contain '-': request ids are '<session>-<scope>'")
        self.plugin = plugin
        self.engine = engine
        self._capabilities = capabilities
        self.limits = limits or SessionLimits()
        self._vad_model = vad_model
        self._clock = clock
        self._on_close = on_close
        self._mailbox: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._events: asyncio.Queue[p.ServerEvent | None] = asyncio.Queue()
        self._received = 0  # client commands received so far; each is numbered in arrival order
        self._ids = itertools.count(1)
        self._queued_append_bytes = 0
        self._broken_through = 0  # appends received up to this seq are dropped after a failed append
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        self.closed_reason: str | None = None

        self.config = DuplexSessionConfig(input_sample_rate=capabilities.input_sample_rate)
        self.configured = False
        self.runtime_config: dict[str, object] = {}
        self.state: DuplexModelSessionState = plugin.create_session_state()
        self._sampling: tuple[object, ...] = ()
        self._resampler: StreamingResampler | None = None
        self._vad_settings: VadSettings | None = None
        self._vad: VadStream | None = None
        self._vad_resampler: StreamingResampler | None = None
        self._prefix: deque[np.ndarray] = deque()
        self._prefix_samples = 0

        self.epoch = 0
        self.turn_id = 0
        self._append_seq = 0
        self._input_request_id: str | None = None
        self._input_item_id: str | None = None
        self.active: ActiveResponse | None = None
        self._last_response: ActiveResponse | None = None
        #: Committed user turns whose input is closed, waiting for their response: (turn, item, request).
        self._pending_turns: deque[tuple[int, str, str]] = deque()
        self._committed_turns = 0
        self.history: list[HistoryItem] = []
        self._user_items_by_turn: dict[int, str] = {}
        self.dropped_stale_outputs = 0
        self._last_activity = clock()
        self._silence = SilenceContinuation(
            self.post,
            period_s=plugin.silence_continuation_samples / capabilities.input_sample_rate,
            state=self.state,
            clock=clock,
            enabled=capabilities.input_mode == "continuous",
        )

    # ---- the Conversation interface ----

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self._capabilities

    @property
    def skipped_silence_units(self) -> int:
        """Silence units not sent because the loop could not serve their deadline in time."""
        return self._silence.skipped_units

    @property
    def fence(self) -> DuplexFence:
        return DuplexFence(self.epoch, self.turn_id)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"runner-{self._session_id}")

    def send(self, event: p.ClientEvent) -> None:
        """Queue a client event (non-blocking). Appends over the byte limit are refused here."""
        if self._closed.is_set():
            return
        self._received += 1
        seq = self._received
        if isinstance(event, p.InputAudioBufferAppend):
            size = event.audio.nbytes
            if self._queued_append_bytes + size > self.limits.max_pending_input_bytes:
                self._error("input_backpressure", "too much input audio is waiting; slow down", event.event_id)
                return
            self._queued_append_bytes += size
        self._mailbox.put_nowait((seq, event))

    def post(self, command: SilenceTick) -> None:
        """Queue an internal command behind the client's."""
        self._mailbox.put_nowait((0, command))

    async def next_event(self) -> p.ServerEvent | None:
        """The next server event, None once closed; safe to cancel (nothing is lost)."""
        event = await self._events.get()
        if event is None:
            self._events.put_nowait(None)  # every later reader sees the end too
        return event

    async def events(self) -> AsyncIterator[p.ServerEvent]:
        while (event := await self.next_event()) is not None:
            yield event

    async def close(self, reason: str = "client_closed") -> None:
        if self._task is None:
            return
        if not self._closed.is_set():
            self.closed_reason = self.closed_reason or reason
            self._mailbox.put_nowait((0, _CLOSE))
        await asyncio.shield(self._task)

    # ---- mailbox ----

    async def _run(self) -> None:
        self._silence.start()
        idle = asyncio.create_task(self._expire_when_idle())
        try:
            while True:
                seq, command = await self._mailbox.get()
                if command is _CLOSE:
                    break
                if isinstance(command, p.InputAudioBufferAppend):
                    self._queued_append_bytes -= command.audio.nbytes
                    if seq <= self._broken_through:
                        continue
                try:
                    await self._handle(command)
                except p.ProtocolError as exc:
                    self._error(exc.code, str(exc), exc.event_id or command.event_id)
                except DuplexRuntimeConfigError as exc:
                    self._error(exc.code, str(exc), command.event_id)
                except AppendFailed as exc:
                    self._broken_through = self._received  # everything queued behind it
                    self._error("append_failed", str(exc), command.event_id, error_type="server_error")
        except Exception:
            log.exception("session %s runner failed", self._session_id)
            self.closed_reason = self.closed_reason or "internal_error"
        finally:
            idle.cancel()
            await self._shutdown(idle)

    async def _handle(self, command: p.ClientEvent | SilenceTick) -> None:
        if isinstance(command, SilenceTick):
            await self._continue_with_silence(command)
            return
        self._last_activity = self._clock()
        if isinstance(command, p.SessionUpdate):
            await self._session_update(command)
            return
        if not self.configured:
            raise p.ProtocolError("session_not_configured", "send session.update first", event_id=command.event_id)
        if isinstance(command, p.InputAudioBufferAppend):
            await self._append(command)
        elif isinstance(command, p.InputAudioBufferCommit):
            await self._commit(command.event_id)
        elif isinstance(command, p.InputAudioBufferClear):
            self._clear_input()
            self._emit(p.InputAudioBufferCleared())
        elif isinstance(command, p.ResponseCreate):
            await self._response_create(command)
        elif isinstance(command, p.ResponseCancel):
            await self._response_cancel(command)
        elif isinstance(command, p.ConversationItemTruncate):
            self._truncate(command)
        elif isinstance(command, p.PlaybackAck):
            self._playback_ack(command)
        elif isinstance(command, p.OutputAudioBufferClear):
            target = self.active or self._last_response
            if not await self._cancel("output_cleared") and target is not None:
                target.ledger.interrupt()
            self._emit(p.OutputAudioBufferCleared(target.response_id if target else None))
        elif isinstance(command, p.InputDtmf):
            if command.digit not in DTMF_DIGITS:
                raise p.ProtocolError("invalid_field", f"DTMF digit must be one of {''.join(sorted(DTMF_DIGITS))}")
            self._emit(p.DtmfReceived(command.digit))

    # ---- session configuration ----

    async def _session_update(self, command: p.SessionUpdate) -> None:
        update = dict(command.session)
        if not self.configured:
            update.setdefault("turn_detection", {"type": "server_vad"})
        config = apply_session_update(self.config, update, started=self.configured)
        self.plugin.validate_client_extra_body(config.extra_body)
        if self.configured:
            self.runtime_config = self.plugin.runtime_config_for_update(config, self.runtime_config)
        else:
            self.runtime_config = await self.plugin.prepare_runtime_config(config, model_config=None)
            self._sampling = self.plugin.configure_sampling_params(
                runtime_config=self.runtime_config, defaults=self.engine.sampling_defaults
            )
            self._resampler = StreamingResampler(config.input_sample_rate, self._capabilities.input_sample_rate)
        self.config = config
        self._configure_vad()
        session = {
            "id": self._session_id,
            **session_config_dict(config),
            "capabilities": self._capabilities.to_dict(),
        }
        if self.configured:
            self._emit(p.SessionUpdated(session))
        else:
            self.configured = True
            self._emit(p.SessionCreated(session))

    def _configure_vad(self) -> None:
        settings = VadSettings.from_dict(self.config.turn_detection) if self.config.turn_detection else None
        if settings == self._vad_settings:
            return
        self._vad_settings = settings
        self._vad = None
        if settings is None:
            return
        if self._vad_model is None:
            self._vad_model = SileroVadModel.shared()
        self._vad = settings.new_stream(self._vad_model, sample_rate=16000)
        self._vad_resampler = StreamingResampler(self._capabilities.input_sample_rate, 16000)

    # ---- input ----

    async def _append(self, command: p.InputAudioBufferAppend) -> None:
        samples = command.audio
        if command.sample_rate_hz not in (None, self.config.input_sample_rate):
            raise p.ProtocolError("sample_rate_mismatch", f"this session's input is {self.config.input_sample_rate} Hz, "
                                  f"the append says {command.sample_rate_hz} Hz", event_id=command.event_id)
        if len(samples) > self.limits.max_append_samples(self.config.input_sample_rate):
            raise p.ProtocolError("audio_frame_too_large", "one append may carry at most "
                                  f"{self.limits.max_append_ms} ms of audio", event_id=command.event_id)
        assert self._resampler is not None
        audio = self._resampler.process(samples)
        if audio.size == 0:
            return
        pending = self.state.audio_buffer.pending_byte_count + audio.size * 4
        if pending > self.limits.max_buffered_bytes(self._capabilities.input_sample_rate):
            raise p.ProtocolError("input_backpressure", "the model is not taking input fast enough",
                                  event_id=command.event_id)
        self.state.input_since_commit = True
        if self._vad is None:
            await self._feed(audio)
            return
        await self._vad_route(audio)

    async def _vad_route(self, audio: np.ndarray) -> None:
        """Run server VAD; in turn mode, pass only speech (plus its prefix) to the model."""
        assert self._vad is not None and self._vad_resampler is not None and self._vad_settings is not None
        was_speaking = self._vad.speaking
        vad_events = self._vad.push(self._vad_resampler.process(audio))
        continuous = self._capabilities.input_mode == "continuous"
        speaking_now = was_speaking
        feed_now = continuous or was_speaking
        for vad_event in vad_events:
            if vad_event.kind == "speech_started":
                speaking_now = True
                await self._on_speech_started(vad_event.audio_ms)
                if not continuous:
                    await self._feed_prefix()
                    feed_now = True
            else:
                speaking_now = False
                if feed_now:
                    await self._feed(audio)
                    feed_now = False
                audio = np.zeros(0, dtype=np.float32)
                await self._on_speech_stopped(vad_event.audio_ms)
        if audio.size and feed_now:
            await self._feed(audio)
        elif audio.size and not speaking_now:
            self._remember_prefix(audio)

    def _remember_prefix(self, audio: np.ndarray) -> None:
        assert self._vad_settings is not None
        keep = int(self._capabilities.input_sample_rate * (self._vad_settings.prefix_padding_ms + 100) / 1000)
        self._prefix.append(audio)
        self._prefix_samples += audio.size
        while self._prefix and self._prefix_samples - self._prefix[0].size >= keep:
            self._prefix_samples -= self._prefix.popleft().size

    async def _feed_prefix(self) -> None:
        if self._prefix:
            audio = np.concatenate(list(self._prefix))
            self._prefix.clear()
            self._prefix_samples = 0
            await self._feed(audio)

    async def _on_speech_started(self, audio_ms: float) -> None:
        assert self._vad_settings is not None
        self.state.speech_since_commit = True
        self._input_item_id = self._input_item_id or self._new_id("item")
        start = max(0.0, audio_ms - self._vad_settings.prefix_padding_ms)
        self._emit(p.SpeechStarted(start, self._input_item_id))
        if (
            self.config.overlap_policy == "barge_in"
            and self._vad_settings.interrupt_response
            and self._capabilities.supports_barge_in
            and not self._capabilities.handles_overlap
        ):
            await self._cancel("barge_in")

    async def _on_speech_stopped(self, audio_ms: float) -> None:
        assert self._vad_settings is not None
        self._emit(p.SpeechStopped(audio_ms, self._input_item_id or self._new_id("item")))
        if self._capabilities.input_mode == "turn":
            await self._commit(None, create_response=self._vad_settings.create_response)

    async def _feed(self, audio: np.ndarray, *, silence_deadline: float | None = None) -> None:
        """Hand model-rate audio to the append buffer and submit the whole units it emits.

        ``silence_deadline`` marks a silence-continuation unit and the deadline it was due at.
        """
        self._append_seq += 1
        reservation = self.state.audio_buffer.prepare_append(
            {"audio": audio.astype("<f4").tobytes(), "sample_rate": self._capabilities.input_sample_rate},
            operation_id=f"append-{self._append_seq}",
            chunk_period_ms=round(self._capabilities.unit_ms),
            allow_emit=True,
        )
        if reservation is not None:
            await self._submit_input(reservation, final=False, silence_deadline=silence_deadline)
        if silence_deadline is None:
            self._silence.anchor()

    async def _continue_with_silence(self, tick: SilenceTick) -> None:
        if not self._silence.is_current(tick) or not self.configured:
            return
        self.state.continuation_owner_id = self._input_request_id
        try:
            await self._feed(np.zeros(self.plugin.silence_continuation_samples, dtype=np.float32),
                             silence_deadline=tick.deadline)
        finally:
            self._silence.advance(tick)  # a failed submit must not stall the schedule

    def _open_input_request(self) -> tuple[str, bool]:
        """The stage-0 request taking this input: per epoch (continuous) or per turn."""
        if self._input_request_id is None:
            scope = f"e{self.epoch}" if self._capabilities.input_mode == "continuous" else f"t{self._committed_turns + 1}"
            self._input_request_id = f"{self._session_id}-{scope}-in-{next(self._ids)}"
            return self._input_request_id, True
        return self._input_request_id, False

    async def _submit_input(self, reservation: PcmAppendReservation, *, final: bool,
                            silence_deadline: float | None = None) -> str:
        request_id, opened = self._open_input_request()
        payload = dict(reservation.payload or {})
        payload["duplex_turn_id"] = self._committed_turns + (0 if self._capabilities.input_mode == "continuous" else 1)
        if silence_deadline is not None:
            payload["duplex_silence_deadline"] = silence_deadline
        runtime = self.plugin.prepare_prompt_config(dict(self.runtime_config), state=self.state, payload=payload)
        plan = await self.plugin.prepare_append_plan(
            request_id=request_id,
            fence=self.fence,
            session_config=session_config_dict(self.config),
            runtime_config=runtime,
            seq=self._append_seq,
            turn_seq=self.turn_id,
            payload=payload,
            final=final,
            sampling_params=self._sampling[0] if self._sampling else None,
        )
        try:
            await self.engine.submit(plan)
        except EngineSubmitError as exc:
            reservation.rollback()
            if opened:
                self._input_request_id = None
            raise AppendFailed(str(exc)) from exc
        reservation.commit()
        if opened and self._capabilities.input_mode == "continuous":
            self._watch(request_id, plan.stage_id, response=None)
        return request_id

    def _clear_input(self) -> None:
        self.state.audio_buffer.clear()
        self.state.clear_committed_audio()
        self.state.input_since_commit = False
        self.state.speech_since_commit = False
        self._prefix.clear()
        self._prefix_samples = 0
        if self._vad is not None:
            self._vad.reset()
        if self._capabilities.input_mode == "turn" and self._input_request_id is not None:
            self._spawn(self.engine.abort([self._input_request_id]))
            self._input_request_id = None

    async def _commit(self, event_id: str | None, *, create_response: bool = True) -> None:
        if self._capabilities.input_mode == "continuous":
            raise p.ProtocolError("commit_not_supported", "this model listens continuously; nothing to commit",
                                  event_id=event_id)
        if not self.state.input_since_commit and not self.state.audio_buffer.has_pending() \
                and self._input_request_id is None:
            raise p.ProtocolError("input_audio_buffer_commit_empty", "there is no input audio to commit",
                                  event_id=event_id)
        if len(self._pending_turns) >= self.limits.max_pending_turns:
            self._clear_input()
            raise p.ProtocolError("input_backpressure", "too many user turns are waiting for a response",
                                  event_id=event_id)
        item_id = self._input_item_id or self._new_id("item")
        previous = self.history[-1].item_id if self.history else None
        self.history.append(HistoryItem(item_id, "user"))
        self._emit(p.InputAudioBufferCommitted(item_id, previous))
        reservation = self.state.audio_buffer.prepare_commit(
            operation_id=f"commit-{self._append_seq}", chunk_period_ms=round(self._capabilities.unit_ms)
        )
        request_id = await self._submit_input(reservation, final=True)
        self._input_request_id = None
        self._committed_turns += 1
        self.state.input_since_commit = False
        self.state.speech_since_commit = False
        self._input_item_id = None
        self._pending_turns.append((self._committed_turns, item_id, request_id))
        if create_response:
            await self._start_next_turn()
        else:
            self.state.deferred_response_create = True

    async def _response_create(self, command: p.ResponseCreate) -> None:
        if not self._pending_turns:
            raise p.ProtocolError("no_committed_input", "commit input audio before response.create",
                                  event_id=command.event_id)
        self.state.deferred_response_create = False
        await self._start_next_turn()

    async def _start_next_turn(self) -> None:
        """Open the response of the oldest waiting turn, unless a response is running."""
        if self.active is not None or not self._pending_turns:
            return
        turn_id, item_id, request_id = self._pending_turns.popleft()
        self._commit_model_context()
        self.turn_id = turn_id
        response = self._open_response(turn_id)
        response.request_ids.add(request_id)
        self._user_items_by_turn[turn_id] = item_id
        self._watch(request_id, 0, response=response)

    # ---- responses ----

    def _open_response(self, turn_id: int) -> ActiveResponse:
        response_id = self._new_id("resp")
        item_id = self._new_id("item")
        ledger = ResponseLedger(response_id, item_id)
        response = ActiveResponse(response_id, item_id, turn_id, self.fence, ledger)
        self.active = response
        self._last_response = response
        self.history.append(HistoryItem(item_id, "assistant", ledger=ledger))
        self._emit(p.ResponseCreated(response_id, item_id))
        return response

    def _finish_response(self, response: ActiveResponse, status: str, reason: str = "") -> None:
        if self.active is not response:
            return
        self.active = None
        if not response.audio_done and response.ledger.generated_ms > 0:
            response.audio_done = True
            self._emit(p.ResponseAudioDone(response.response_id, response.item_id))
            self._emit(p.ResponseTranscriptDone(response.response_id, response.item_id, response.ledger.full_text()))
        self._emit(p.ResponseDone(response.response_id, status, reason, audio_ms=response.ledger.sent_ms))
        if status == "completed":
            self._spawn(self._start_next_turn())

    async def _response_cancel(self, command: p.ResponseCancel) -> None:
        active, last = self.active, self._last_response
        if active is not None and command.response_id in (None, active.response_id):
            await self._cancel(command.reason)
        elif last is not None and command.response_id in (None, last.response_id):
            # Generation had finished but its audio may still be playing at the edge.
            last.ledger.interrupt()
            self._emit(p.OutputAudioBufferCleared(last.response_id))
        elif command.response_id:
            raise p.ProtocolError("response_not_found", f"no response {command.response_id!r}",
                                  event_id=command.event_id)
        else:
            raise p.ProtocolError("response_cancel_not_active", "no response to cancel", event_id=command.event_id)

    async def _cancel(self, reason: str) -> bool:
        """The cancel sequence: epoch + 1, abort the old epoch's requests, tell the client."""
        response = self.active
        if response is None:
            return False
        self.epoch += 1
        self.active = None
        stale = set(response.request_ids)
        if self._capabilities.input_mode == "continuous" and self._input_request_id is not None:
            stale.add(self._input_request_id)
            self._input_request_id = None
            self.state.audio_buffer.clear_force_listen()
        await self.engine.abort(stale)
        for request_id in stale:
            self.plugin.data_plane.close_stream(request_id)
        response.ledger.interrupt()
        self._emit(p.ResponseDone(response.response_id, "cancelled", reason, audio_ms=response.ledger.sent_ms))
        if response.ledger.unplayed_ms > 0:
            self._emit(p.OutputAudioBufferCleared(response.response_id))
        return True

    def _truncate(self, command: p.ConversationItemTruncate) -> None:
        item = next((i for i in self.history if i.item_id == command.item_id and i.ledger), None)
        if item is None or item.ledger is None:
            raise p.ProtocolError("item_not_found", f"no assistant item {command.item_id!r}", event_id=command.event_id)
        item.ledger.acknowledge(command.audio_end_ms)
        item.ledger.interrupt()

    def _playback_ack(self, command: p.PlaybackAck) -> None:
        item = next((i for i in reversed(self.history) if i.ledger and i.ledger.response_id == command.response_id),
                    None)
        if item is None or item.ledger is None:
            raise p.ProtocolError("response_not_found", f"no response {command.response_id!r}",
                                  event_id=command.event_id)
        item.ledger.acknowledge(command.played_ms)

    def _commit_model_context(self) -> None:
        """At a turn boundary, the model keeps only the assistant words the caller heard."""
        speaking = self.active.ledger if self.active else None
        for item in self.history:
            if item.role == "assistant" and not item.committed_to_model and item.ledger is not speaking:
                item.committed_to_model = True
                self.plugin.commit_model_context(session_id=self._session_id, assistant_text=item.heard_text)

    # ---- stage outputs ----

    def _watch(self, request_id: str, stage_id: int, *, response: ActiveResponse | None) -> None:
        stream = _StageStream(request_id, stage_id, self.fence, self.turn_id, response)
        self.plugin.data_plane.begin_request(request_id)
        self._spawn(self._consume(stream))

    async def _consume(self, stream: _StageStream) -> None:
        try:
            async for output in self.engine.outputs(stream.request_id):
                if not stream.fence.admits(self.fence) or self._closed.is_set():
                    self.dropped_stale_outputs += 1
                    continue
                await self._on_output(stream, output)
        finally:
            self.plugin.data_plane.close_stream(stream.request_id)

    async def _on_output(self, stream: _StageStream, out: StageOutput) -> None:
        final_stage = self.engine.stage_count - 1
        if out.error is not None:
            self._error("stage_failed", f"stage {out.stage_id} failed: {out.error}", None, error_type="server_error")
            if stream.response is not None:
                await self.engine.abort(stream.response.request_ids)
                self._finish_response(stream.response, "failed", "stage_failed")
            return
        if lag := out.metadata.get("lag_ms"):
            self._emit(p.SessionLagging(f"stage{out.stage_id}", float(lag)))  # type: ignore[arg-type]
        transcript = self.plugin.user_transcript(
            stage_id=out.stage_id, output=out.output, prompt=None, finished=out.finished
        )
        if transcript is not None:
            self._user_transcript(stream.turn_id, transcript)
        decision = self.plugin.decide_output(
            stage_id=out.stage_id,
            final_stage_id=final_stage,
            segment_finished=out.finished,
            segment_token_ids=out.token_ids,
            segment_output_metadata=dict(out.metadata),
            output=out.output,
        )
        response = stream.response
        if decision is not None and decision.action == "listen":
            if response is None and self.active is not None and self._capabilities.input_mode == "continuous":
                response = self.active
            self._emit(p.ResponseListen(response.response_id if response else None, decision.reason))
            if response is not None:
                await self.engine.abort(response.request_ids - {stream.request_id})
                self._finish_response(response, "completed", decision.reason or "listen")
            return
        if decision is not None and decision.action in ("speak", "finish") and response is None:
            response = self.active or self._open_response(self.turn_id)
            response.request_ids.add(stream.request_id)
        if response is not None and decision is not None and not response.spoke:
            response.spoke = True
            self._emit(p.ResponseSpeak(response.response_id))
        projects = out.stage_id == final_stage or self.plugin.projects_intermediate_outputs or \
            self.plugin.project_intermediate_output(stage_id=out.stage_id, output=out.output, context=None)
        if projects and response is not None and response is self.active:
            self._project(response, out)
        if out.stage_id < final_stage and response is not None:
            await self._forward(stream, out)
        if response is not None and (
            (out.stage_id == final_stage and out.finished and self._capabilities.input_mode == "turn")
            or (decision is not None and decision.action == "finish")
        ):
            self._finish_response(response, "completed")

    def _user_transcript(self, turn_id: int, transcript: str) -> None:
        item_id = self._user_items_by_turn.get(turn_id)
        item = next((i for i in self.history if i.item_id == item_id), None)
        if item is not None:
            item.text = transcript
        self._emit(p.InputTranscriptionCompleted(item_id or self._new_id("item"), transcript))

    def _project(self, response: ActiveResponse, out: StageOutput) -> None:
        context = self.plugin.data_plane_context(
            epoch=self.epoch,
            turn_id=self.turn_id,
            active_response_turn_id=response.turn_id,
            active_response_id=response.response_id,
            auto_responds=bool(self._vad_settings and self._vad_settings.create_response),
            response_format=self.config.output_audio_format,
            speed=None,
            modalities=self.config.modalities,
        )
        for item in self.plugin.data_plane.project(out, context=context):
            kind = item.get("type")
            if kind == "response.output_audio.delta":
                if item["delta"] is None:
                    continue
                marks = [TextMark(str(m["text"]), float(m["start_ms"]), float(m["end_ms"]))
                         for m in item.get("marks", [])]  # type: ignore[union-attr]
                duration = float(item["audio_ms"])  # type: ignore[arg-type]
                start = response.ledger.record_audio(duration, marks)
                self._emit(p.ResponseAudioDelta(
                    response.response_id, response.item_id, item["delta"], int(item["sample_rate"]),  # type: ignore[arg-type]
                    start, duration, [{"text": m.text, "start_ms": m.start_ms + start, "end_ms": m.end_ms + start}
                                      for m in marks],
                ))
            elif kind == "response.output_audio_transcript.delta":
                response.ledger.record_text(str(item["delta"]))
                self._emit(p.ResponseTranscriptDelta(response.response_id, response.item_id, str(item["delta"])))

    async def _forward(self, stream: _StageStream, out: StageOutput) -> None:
        """Pass a stage's output downstream: partial updates if the plugin makes them, else at its end."""
        stream.req_state["finished"] = out.finished  # the plugin's cue to close what it forwards
        forward = self.plugin.plan_partial_stage_output(self, out.stage_id, 0, out.output, stream.req_state)
        if forward is not None:
            stream.forwarded_partial = True
        elif out.finished and not stream.forwarded_partial:
            forward = PartialStageForward(output=out.output, is_final_update=True)
        if forward is None:
            return
        await self._submit_downstream(stream, forward)
        followup = self.plugin.partial_stage_followup(forward, stream.req_state)
        if followup is not None:
            await self._submit_downstream(stream, followup)

    async def _submit_downstream(self, stream: _StageStream, forward: PartialStageForward) -> None:
        response = stream.response
        assert response is not None
        next_stage = stream.stage_id + 1
        request_id = stream.req_state.get("downstream_request_id")
        opened = request_id is None
        if opened:
            request_id = f"{stream.request_id}-s{next_stage}"
            stream.req_state["downstream_request_id"] = request_id
        final = forward.is_final_update and not forward.queue_close_after
        plan = DuplexAppendPlan(
            request_id=str(request_id),
            stage_id=next_stage,
            fence=stream.fence,
            payload=None if forward.close_only else forward.output,
            final=final,
            resumable=not final,
            sampling_params=self._sampling[next_stage] if len(self._sampling) > next_stage else None,
        )
        try:
            await self.engine.submit(plan)
        except EngineSubmitError as exc:
            self._error("stage_failed", str(exc), None, error_type="server_error")
            await self.engine.abort(response.request_ids)
            self._finish_response(response, "failed", "stage_failed")
            return
        if opened:
            response.request_ids.add(str(request_id))
            child = _StageStream(str(request_id), next_stage, stream.fence, stream.turn_id, response)
            self.plugin.data_plane.begin_request(str(request_id))
            self._spawn(self._consume(child))

    # ---- helpers ----

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:16]}"

    def _emit(self, event: p.ServerEvent) -> None:
        if not self._closed.is_set():
            self._events.put_nowait(event)

    def _error(self, code: str, message: str, event_id: str | None, *, error_type: str = "invalid_request_error") -> None:
        self._emit(p.ErrorEvent.of(code, message, event_id=event_id, error_type=error_type))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire_when_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.limits.idle_timeout_s / 4))
            if self._clock() - self._last_activity > self.limits.idle_timeout_s:
                self.closed_reason = "idle_timeout"
                self._mailbox.put_nowait((0, _CLOSE))
                return

    async def _shutdown(self, idle: asyncio.Task[Any]) -> None:
        await self._silence.stop()
        requests = set(self.active.request_ids) if self.active else set()
        if self._input_request_id:
            requests.add(self._input_request_id)
        await self.engine.abort(requests)
        for task in list(self._tasks) + [idle]:
            task.cancel()
        await asyncio.gather(*self._tasks, idle, return_exceptions=True)
        self.plugin.data_plane.close_session(self._session_id)
        reason = self.closed_reason or "closed"
        self._events.put_nowait(p.SessionClosed(reason))
        self._closed.set()
        self._events.put_nowait(None)
        if self._on_close is not None:
            self._on_close(self)

