"""The session runner: one per conversation, one ordered mailbox.

Typed client events go in through ``send``; typed server events come out of
``events``. One task, the mailbox's, handles every command in order and is the
only one that changes the session. The runner owns the conversation's clock of
epochs: every cancel, clear and barge-in advances the epoch, every piece of
work captures the fence it started under, and results of an older epoch are
dropped.

The work is split by role: ``input_pipeline`` (caller audio to the model),
``responses`` (turns, history, cancel), ``stage_router`` (stage outputs to the
client and downstream), ``function_calls`` (the model's calls and the client's
outputs); this file is the lifecycle and the mailbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from duplex_agent.agent.models.vad import SharedScores, SileroVadModel
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.session_config import apply_session_update, session_config_dict
from duplex_agent.agent.protocol.tools import session_tools
from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.function_calls import FUNCTION_ITEM_TYPES, FunctionCalls
from duplex_agent.agent.session.input_pipeline import AppendFailed, InputPipeline
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.outbox import EventOutbox
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.agent.session.responses import ActiveResponse, ContinuationDue, HistoryItem, ResponseManager
from duplex_agent.agent.session.silence import SilenceContinuation, SilenceTick
from duplex_agent.agent.session.stage_router import StageOutputArrived, StageRouter, StageStreamEnded
from duplex_agent.plugins.contract import (
    DuplexCapabilities,
    DuplexFence,
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexRuntimeConfigError,
    DuplexSessionConfig,
)
from duplex_agent.plugins.contract.engine import DuplexEngine

__all__ = ["ActiveResponse", "AppendFailed", "DuplexSessionRunner", "HistoryItem"]

log = logging.getLogger("duplex_agent.runner")
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True)
class _Close:
    """Mailbox command: end the session (``reason`` unless one was already set)."""

    reason: str
    event_id: None = None


@dataclass(frozen=True, slots=True)
class _TaskFailed:
    """Mailbox command: a task the runner spawned raised."""

    name: str
    error: BaseException
    event_id: None = None


class DuplexSessionRunner(Conversation):
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
        on_close: Callable[[DuplexSessionRunner], object] | None = None,
    ) -> None:
        session_id = session_id or f"sess_{uuid.uuid4().hex[:12]}"
        if "-" in session_id:
            raise ValueError("a session id may not contain '-': request ids are '<session>-<scope>'")
        self.plugin = plugin
        self.engine = engine
        self.limits = limits or SessionLimits()
        self._clock = clock
        self._on_close = on_close
        self._mailbox: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._outbox = EventOutbox(self.limits, clock=clock, on_overflow=self._client_too_slow)
        self._received = 0  # client commands received so far; each is numbered in arrival order
        self._queued_append_bytes = 0
        self._broken_through = 0  # appends received up to this seq are dropped after a failed append
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        self.closed_reason: str | None = None
        self._last_activity = clock()

        self._core = core = SessionCore(session_id, plugin, engine, capabilities, self.limits,
                                        self._emit, self._spawn, self.post)
        self._silence = SilenceContinuation(
            self.post,
            period_s=plugin.silence_continuation_samples / capabilities.input_sample_rate,
            state=core.state,
            clock=clock,
            enabled=core.continuous,
        )
        self._responses = ResponseManager(core)
        self._calls = FunctionCalls(core, self._responses)
        self._router = StageRouter(core, self._responses, self._calls)
        self._responses.watch = self._router.watch
        self._input = InputPipeline(core, self._responses, self._router, self._silence, vad_model=vad_model)

    # ---- the Conversation interface ----

    @property
    def session_id(self) -> str:
        return self._core.session_id

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self._core.capabilities

    # ---- what tests and metrics read ----

    @property
    def config(self) -> DuplexSessionConfig:
        return self._core.config

    @property
    def configured(self) -> bool:
        return self._core.configured

    @property
    def runtime_config(self) -> dict[str, object]:
        return self._core.runtime_config

    @property
    def state(self) -> DuplexModelSessionState:
        return self._core.state

    @property
    def epoch(self) -> int:
        return self._core.epoch

    @property
    def turn_id(self) -> int:
        return self._core.turn_id

    def wire_fence(self) -> tuple[int, int]:
        return (self._core.epoch, self._core.turn_id)

    @property
    def fence(self) -> DuplexFence:
        return self._core.fence

    @property
    def answers_wire_controls(self) -> bool:
        return True

    @property
    def active(self) -> ActiveResponse | None:
        return self._responses.active

    @property
    def history(self) -> list[HistoryItem]:
        return self._responses.history

    @property
    def dropped_stale_outputs(self) -> int:
        return self._router.dropped_stale_outputs

    @property
    def outbox(self) -> EventOutbox:
        """Events the client has not read yet (their count and audio)."""
        return self._outbox

    @property
    def skipped_silence_units(self) -> int:
        """Silence units not sent because the loop could not serve their deadline in time."""
        return self._silence.skipped_units

    # ---- lifecycle ----

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"runner-{self.session_id}")

    def send(self, event: p.ClientEvent) -> None:
        """Queue a client event (non-blocking). Appends over the byte limit are refused here."""
        if self._closed.is_set():
            return
        self._received += 1
        seq = self._received
        if isinstance(event, p.InputAudioBufferAppend):
            size = event.audio.nbytes
            if self._queued_append_bytes + size > self.limits.max_pending_input_bytes:
                self._core.error("input_backpressure", "too much input audio is waiting; slow down", event.event_id)
                self._input.input_dropped()
                return
            self._queued_append_bytes += size
        self._mailbox.put_nowait((seq, event))

    def client_plays_out(self) -> None:
        self._responses.client_plays_out = True

    def use_caller_vad(self, scores: SharedScores) -> None:
        """The call's edge VAD scores every window already: turn detection reads its scores."""
        self._input.use_caller_scores(scores)

    def post(self, command: Any) -> None:
        """Queue an internal command (silence tick, stage output, task failure) behind the client's."""
        self._mailbox.put_nowait((0, command))

    async def next_event(self) -> p.ServerEvent | None:
        """The next server event, None once closed; safe to cancel (nothing is lost)."""
        return await self._outbox.get()

    async def events(self) -> AsyncIterator[p.ServerEvent]:
        while (event := await self.next_event()) is not None:
            yield event

    async def wait_closed(self) -> None:
        """Return once the session has shut down (for whatever reason)."""
        await self._closed.wait()

    async def close(self, reason: str = "client_closed") -> None:
        if self._task is None:
            return
        if not self._closed.is_set():
            self._mailbox.put_nowait((0, _Close(reason)))
        await asyncio.shield(self._task)

    # ---- mailbox ----

    async def _run(self) -> None:
        self._silence.start()
        idle = asyncio.create_task(self._watch_idle_and_stalled())
        try:
            while True:
                seq, command = await self._mailbox.get()
                if isinstance(command, _Close):
                    self.closed_reason = self.closed_reason or command.reason
                    break
                if isinstance(command, p.InputAudioBufferAppend):
                    self._queued_append_bytes -= command.audio.nbytes
                    if seq <= self._broken_through:
                        self._input.input_dropped()
                        continue
                try:
                    await self._handle(command)
                except p.ProtocolError as exc:
                    self._core.error(exc.code, str(exc), exc.event_id or command.event_id, param=exc.param)
                except DuplexRuntimeConfigError as exc:
                    self._core.error(exc.code, str(exc), command.event_id)
                except AppendFailed as exc:
                    self._broken_through = self._received  # everything queued behind it
                    self._core.error(exc.code, str(exc), command.event_id, error_type="server_error")
                except Exception as exc:  # a fault in one command ends that command, not the session
                    log.exception("session %s: handling %s failed", self.session_id, type(command).__name__)
                    self._core.error("internal_error", f"{type(exc).__name__}: {exc}", command.event_id,
                                     error_type="server_error")
        except Exception:
            log.exception("session %s runner failed", self.session_id)
            self.closed_reason = self.closed_reason or "internal_error"
        finally:
            idle.cancel()
            await self._shutdown(idle)

    async def _handle(self, command: Any) -> None:
        if not isinstance(command, p.ClientEvent):
            await self._handle_internal(command)
            return
        self._last_activity = self._clock()
        if isinstance(command, p.SessionHeartbeat):
            self._emit(p.SessionHeartbeatAck(self.session_id))
            return
        if isinstance(command, p.SessionUpdate):
            await self._session_update(command)
            return
        if not self._core.configured:
            raise p.ProtocolError("session_not_configured", "send session.update first", event_id=command.event_id)
        if isinstance(command, p.InputAudioBufferAppend):
            await self._input.append(command)
        elif isinstance(command, p.InputAudioBufferCommit):
            await self._input.commit(command.event_id, create_response=command.response_create is not False)
        elif isinstance(command, p.InputAudioBufferClear):
            self._input.clear()
            self._emit(p.InputAudioBufferCleared())
        elif isinstance(command, p.ResponseCreate):
            self._input.response_create(command)
        elif isinstance(command, p.ResponseCancel):
            await self._responses.response_cancel(command)
        elif isinstance(command, p.ConversationItemTruncate):
            self._responses.truncate(command)
        elif isinstance(command, p.PlaybackAck):
            self._responses.playback_ack(command)
        elif isinstance(command, p.OutputAudioBufferClear):
            await self._responses.output_clear(command.response_id)
        elif isinstance(command, p.BargeIn):
            await self._responses.barge_in()
            # vLLM-Omni's barge_in also drops the input so far (its input.cancel).
            self._input.clear()
            self._emit(p.InputAudioBufferCleared())
        elif isinstance(command, p.ConversationItemCreate):
            if command.item.get("type") in FUNCTION_ITEM_TYPES:
                self._calls.item_create(command)
            else:
                self._responses.item_create(command)
        elif isinstance(command, p.ConversationItemRetrieve):
            self._responses.item_retrieve(command)
        elif isinstance(command, p.ConversationItemDelete):
            self._responses.item_delete(command)
        elif isinstance(command, p.TurnSignal):
            self._emit(p.TurnEvent(command.event, "accepted"))
        elif isinstance(command, p.InputTextAppend):
            raise p.ProtocolError(*p.TEXT_APPEND_REFUSED)
        elif isinstance(command, p.InputDtmf):
            if command.digit not in DTMF_DIGITS:
                raise p.ProtocolError("invalid_field", f"DTMF digit must be one of {''.join(sorted(DTMF_DIGITS))}")
            self._emit(p.DtmfReceived(command.digit))

    async def _handle_internal(self, command: Any) -> None:
        if isinstance(command, StageOutputArrived):
            await self._router.route(command)
        elif isinstance(command, StageStreamEnded):
            await self._router.end(command)
        elif isinstance(command, ContinuationDue):
            await self._router.continue_response(command)
        elif isinstance(command, SilenceTick):
            await self._input.continue_with_silence(command)
        elif isinstance(command, _TaskFailed):
            log.error("session %s: task %s failed: %r", self.session_id, command.name, command.error)
            self._core.error("internal_error", f"{command.name} failed: {command.error}", None,
                             error_type="server_error")

    async def _session_update(self, command: p.SessionUpdate) -> None:
        core, plugin = self._core, self.plugin
        update = dict(command.session)
        if not core.configured and update.get("overlap_policy") != "listen_only":
            # Server VAD unless told otherwise (vLLM-Omni's listen_only means turn_detection null).
            update.setdefault("turn_detection", {"type": "server_vad"})
        config = apply_session_update(core.config, update, started=core.configured)
        if session_tools(config.extra_body) and not core.capabilities.supports_tools:
            raise p.ProtocolError("tools_unsupported", f"the model {core.capabilities.plugin_id!r} cannot call tools",
                                  event_id=command.event_id)
        plugin.validate_client_extra_body(config.extra_body)
        if core.configured:
            core.runtime_config = plugin.runtime_config_for_update(config, core.runtime_config)
        else:
            core.runtime_config = await plugin.prepare_runtime_config(config, model_config=None)
            core.sampling = plugin.configure_sampling_params(
                runtime_config=core.runtime_config, defaults=self.engine.sampling_defaults
            )
        core.config = config
        self._input.configure(first=not core.configured)
        session = {
            "id": self.session_id,
            **session_config_dict(config),
            "capabilities": core.capabilities.to_dict(),
        }
        if core.configured:
            self._emit(p.SessionUpdated(session))
        else:
            core.configured = True
            self._emit(p.SessionCreated(session))

    # ---- helpers ----

    def _emit(self, event: p.ServerEvent) -> None:
        self._outbox.put(event)

    def _client_too_slow(self) -> None:
        """The client stopped reading: keep nothing more for it, tell it why, and close."""
        self.closed_reason = self.closed_reason or "client_too_slow"
        log.warning("session %s: the client stopped reading (%d events, %.0f ms of audio unread); closing",
                    self.session_id, len(self._outbox), self._outbox.audio_ms)
        self._outbox.cut_off(p.SessionLagging("client", round(self._outbox.audio_ms, 1)),
                             p.SessionClosed(self.closed_reason))
        self.post(_Close(self.closed_reason))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self.post(_TaskFailed(task.get_name(), error))  # handled (and logged) by the mailbox task

    async def _watch_idle_and_stalled(self) -> None:
        """Close a session whose client sends nothing, or cut off one that stopped reading."""
        limits = self.limits
        while True:
            await asyncio.sleep(min(1.0, limits.idle_timeout_s / 4, limits.client_stall_s / 2))
            self._outbox.check_stall()
            if self._clock() - self._last_activity > limits.idle_timeout_s:
                self.post(_Close("idle_timeout"))
                return

    async def _shutdown(self, idle: asyncio.Task[Any]) -> None:
        await self._silence.stop()
        core = self._core
        requests = set(self._responses.active.request_ids) if self._responses.active else set()
        if core.input_request_id:
            requests.add(core.input_request_id)
        await self.engine.abort(requests)
        for task in list(self._tasks) + [idle]:
            task.cancel()
        await asyncio.gather(*self._tasks, idle, return_exceptions=True)
        self.plugin.data_plane.close_session(self.session_id)
        self._outbox.seal(p.SessionClosed(self.closed_reason or "closed"))
        self._closed.set()
        if self._on_close is not None:
            self._on_close(self)
