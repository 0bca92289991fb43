"""The input pipeline: the caller's audio on its way to the model.

One append: check -> resample to the model rate -> server VAD (turn mode passes
only speech and its prefix) -> append buffer (whole units) -> plugin plan ->
engine submit. Commits close a user turn and queue it for a response; silence
units keep a continuous model's turn going while the caller is quiet.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from duplex_agent.agent.models.end_of_turn import EndOfTurnModel, TurnDetector
from duplex_agent.agent.models.vad import VAD_RATE, SharedScores, SileroVadModel, VadSettings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.agent.protocol.session_config import session_config_dict
from duplex_agent.agent.protocol.tools import given_text, response_tool_options
from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.responses import ResponseManager
from duplex_agent.agent.session.silence import SilenceContinuation, SilenceTick
from duplex_agent.agent.session.stage_router import StageRouter
from duplex_agent.plugins.contract import RESPONSE_SAY, PcmAppendReservation
from duplex_agent.plugins.contract.engine import EngineSubmitError


class AppendFailed(RuntimeError):
    """The engine refused input or the plugin failed to plan it; the input is rolled back
    and the runner drops the appends queued behind it."""

    def __init__(self, message: str, *, code: str = "append_failed") -> None:
        super().__init__(message)
        self.code = code


class InputPipeline:
    def __init__(
        self,
        core: SessionCore,
        responses: ResponseManager,
        router: StageRouter,
        silence: SilenceContinuation,
        *,
        vad_model: SileroVadModel | None,
    ) -> None:
        self._core = core
        self._responses = responses
        self._router = router
        self._silence = silence
        self._vad_model = vad_model
        self._resampler: StreamingResampler | None = None
        self._vad_settings: VadSettings | None = None
        self._vad: TurnDetector | None = None
        self._vad_resampler: StreamingResampler | None = None
        self._prefix: deque[np.ndarray] = deque()
        self._prefix_samples = 0
        #: The open turn's model-rate audio, and the last committed turn's until its reply speaks: a
        #: caller who goes on before then was cut off too soon, and that turn leads the next one.
        self._turn_audio = TurnAudio()
        self._last_turn_audio = TurnAudio()
        self._append_seq = 0
        self._input_item_id: str | None = None
        #: Without server VAD, vLLM-Omni counts a turn's first append as speech_started and its commit as
        #: speech_stopped: where the client's input stands (ms) and whether that turn has started.
        self._client_audio_ms = 0.0
        self._client_turn_open = False
        # The call's edge VAD scores (one VAD pass per call), while this session's input
        # timeline is the edge's: from the first append, with nothing dropped.
        self._caller_scores: SharedScores | None = None
        self._audio_seen = False

    def use_caller_scores(self, scores: SharedScores) -> None:
        """Read the edge's window scores instead of running the VAD model again."""
        if not self._audio_seen:
            self._caller_scores = scores
            if self._vad is not None:
                self._vad.vad.scores_in = scores

    def input_dropped(self) -> None:
        """Some caller audio never reached the VAD: the edge's windows no longer line up."""
        self._caller_scores = None
        if self._vad is not None:
            self._vad.vad.scores_in = None

    def configure(self, *, first: bool) -> None:
        """Follow the session's config: the input resampler (once) and server VAD."""
        core = self._core
        if first:
            self._resampler = StreamingResampler(core.config.input_sample_rate, core.capabilities.input_sample_rate)
        turn_detection = core.config.turn_detection
        settings = VadSettings.from_dict(turn_detection) if turn_detection else None
        core.auto_responds = bool(settings and settings.create_response)
        if settings == self._vad_settings:
            return
        self._vad_settings = settings
        if settings is None:
            self._vad = None
            self.input_dropped()  # the VAD stops following the input
            return
        if self._vad_model is None:
            self._vad_model = SileroVadModel.shared()
        # The end-of-turn model only matters where pauses commit turns.
        end_of_turn = EndOfTurnModel.shared() if settings.end_of_turn and not core.continuous else None
        if self._vad is not None:
            self._vad.retune(settings, end_of_turn)  # same stream, same timeline
            return
        self._vad = TurnDetector.from_settings(settings, self._vad_model, end_of_turn,
                                               scores_in=None if self._audio_seen else self._caller_scores)
        self._vad_resampler = StreamingResampler(core.capabilities.input_sample_rate, VAD_RATE)

    # ---- appends ----

    async def append(self, command: p.InputAudioBufferAppend) -> None:
        self._audio_seen = True
        try:
            await self._append(command)
        except p.ProtocolError:
            self.input_dropped()
            raise

    async def _append(self, command: p.InputAudioBufferAppend) -> None:
        core = self._core
        samples = command.audio
        rate = core.config.input_sample_rate
        if command.sample_rate_hz not in (None, rate):
            raise p.ProtocolError("sample_rate_mismatch", f"this session's input is {rate} Hz, "
                                  f"the append says {command.sample_rate_hz} Hz", event_id=command.event_id)
        if len(samples) > core.limits.max_append_samples(rate):
            raise p.ProtocolError("audio_frame_too_large", "one append may carry at most "
                                  f"{core.limits.max_append_ms} ms of audio", event_id=command.event_id)
        assert self._resampler is not None
        audio = self._resampler.process(samples)
        if audio.size == 0:
            return
        pending = core.state.audio_buffer.pending_byte_count + audio.size * 4
        if pending > core.limits.max_buffered_bytes(core.capabilities.input_sample_rate):
            raise p.ProtocolError("input_backpressure", "the model is not taking input fast enough",
                                  event_id=command.event_id)
        core.state.input_since_commit = True
        if self._vad is None:
            if not self._client_turn_open:
                self._client_turn_open = True
                self._input_item_id = self._input_item_id or core.new_id("item")
                core.emit(p.SpeechStarted(self._client_audio_ms, self._input_item_id))
            self._client_audio_ms += 1000.0 * samples.size / rate
            await self._feed(audio)
            return
        await self._vad_route(audio)

    async def _vad_route(self, audio: np.ndarray) -> None:
        """Run server VAD; in turn mode, pass only speech (plus its prefix) to the model."""
        assert self._vad is not None and self._vad_resampler is not None and self._vad_settings is not None
        was_speaking = self._vad.speaking
        vad_events = self._vad.push(self._vad_resampler.process(audio))
        continuous = self._core.continuous
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
        keep = int(self._core.capabilities.input_sample_rate * (self._vad_settings.prefix_padding_ms + 100) / 1000)
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
        core = self._core
        assert self._vad_settings is not None
        core.state.speech_since_commit = True
        self._input_item_id = self._input_item_id or core.new_id("item")
        start = max(0.0, audio_ms - self._vad_settings.prefix_padding_ms)
        core.emit(p.SpeechStarted(start, self._input_item_id))
        if (
            core.config.overlap_policy == "barge_in"
            and self._vad_settings.interrupt_response
            and core.capabilities.supports_barge_in
            and not core.capabilities.handles_overlap
        ):
            # Going on before the reply to the last turn said a word means that turn ended too soon
            # (a pause mid-sentence): its audio leads this turn, so its words are recognised with the
            # rest instead of going with the cancelled reply.
            resumed = bool(self._last_turn_audio) and self._responses.withdraw_unanswered_turn()
            await self._responses.cancel("barge_in")
            if resumed:
                await self._feed(self._last_turn_audio.take())
        self._last_turn_audio.clear()

    async def _on_speech_stopped(self, audio_ms: float) -> None:
        assert self._vad_settings is not None
        self._core.emit(p.SpeechStopped(audio_ms, self._input_item_id or self._core.new_id("item")))
        if not self._core.continuous:
            await self.commit(None, create_response=self._vad_settings.create_response)

    async def _feed(self, audio: np.ndarray, *, silence_deadline: float | None = None) -> None:
        """Hand model-rate audio to the append buffer and submit the whole units it emits.

        ``silence_deadline`` marks a silence-continuation unit and the deadline it was due at.
        """
        core = self._core
        self._append_seq += 1
        reservation = core.state.audio_buffer.prepare_append(
            {"audio": audio.astype("<f4").tobytes(), "sample_rate": core.capabilities.input_sample_rate},
            operation_id=f"append-{self._append_seq}",
            chunk_period_ms=round(core.capabilities.unit_ms),
            allow_emit=True,
        )
        if reservation is not None:
            await self._submit(reservation, final=False, silence_deadline=silence_deadline)
        if silence_deadline is None:
            self._silence.anchor()
            if not core.continuous:
                self._turn_audio.add(audio, core.capabilities.input_sample_rate)

    async def continue_with_silence(self, tick: SilenceTick) -> None:
        core = self._core
        if not self._silence.is_current(tick) or not core.configured:
            return
        core.state.continuation_owner_id = core.input_request_id
        try:
            await self._feed(np.zeros(core.plugin.silence_continuation_samples, dtype=np.float32),
                             silence_deadline=tick.deadline)
        finally:
            self._silence.advance(tick)  # a failed submit must not stall the schedule

    def _open_input_request(self) -> tuple[str, bool]:
        """The stage-0 request taking this input: per epoch (continuous) or per turn."""
        core = self._core
        if core.input_request_id is None:
            scope = f"e{core.epoch}" if core.continuous else f"t{core.committed_turns + 1}"
            core.input_request_id = f"{core.session_id}-{scope}-in-{core.next_serial()}"
            return core.input_request_id, True
        return core.input_request_id, False

    async def _submit(self, reservation: PcmAppendReservation, *, final: bool,
                      silence_deadline: float | None = None) -> str:
        core = self._core
        request_id, opened = self._open_input_request()
        payload = dict(reservation.payload or {})
        # the user turn this audio belongs to, for the plugin (``payload_turn_id``)
        payload["duplex_turn_id"] = core.committed_turns + (0 if core.continuous else 1)
        if silence_deadline is not None:
            payload["duplex_silence_deadline"] = silence_deadline
        try:
            runtime = core.plugin.prepare_prompt_config(dict(core.runtime_config), state=core.state, payload=payload)
            plan = await core.plugin.prepare_append_plan(
                request_id=request_id,
                fence=core.fence,
                session_config=session_config_dict(core.config),
                runtime_config=runtime,
                seq=self._append_seq,
                turn_seq=core.turn_id,
                payload=payload,
                final=final,
                sampling_params=core.sampling[0] if core.sampling else None,
            )
        except Exception as exc:
            self._undo(reservation, opened)
            raise AppendFailed(f"the model plugin failed to plan input: {type(exc).__name__}: {exc}",
                               code="plugin_error") from exc
        try:
            await core.engine.submit(plan)
        except EngineSubmitError as exc:
            self._undo(reservation, opened)
            raise AppendFailed(str(exc)) from exc
        reservation.commit()
        if opened and core.continuous:
            self._router.watch(request_id, plan.stage_id, None)
        return request_id

    def _undo(self, reservation: PcmAppendReservation, opened: bool) -> None:
        reservation.rollback()
        if opened:
            self._core.drop_input_request()

    # ---- turns ----

    def clear(self) -> None:
        core = self._core
        core.state.audio_buffer.clear()
        core.state.clear_committed_audio()
        core.state.input_since_commit = False
        core.state.speech_since_commit = False
        self._client_turn_open = False
        self._prefix.clear()
        self._prefix_samples = 0
        self._turn_audio.clear()
        self._last_turn_audio.clear()
        if self._vad is not None:
            self._vad.reset()
        if not core.continuous and (request_id := core.drop_input_request()) is not None:
            core.spawn(core.engine.abort([request_id]))

    async def commit(self, event_id: str | None, *, create_response: bool = True) -> None:
        core = self._core
        if core.continuous:
            # vLLM-Omni's model-native lane: the audio already streams into the model, which decides
            # whether to answer; a commit only seals the user's item.
            item_id = self._input_item_id or core.new_id("item")
            self._input_item_id = None
            self._close_client_turn(item_id)
            self._responses.commit_user_item(item_id)
            return
        if not core.state.input_since_commit and not core.state.audio_buffer.has_pending() \
                and core.input_request_id is None:
            raise p.ProtocolError("input_audio_buffer_commit_empty", "there is no input audio to commit",
                                  event_id=event_id)
        if len(self._responses.pending_turns) >= core.limits.max_pending_turns:
            self.clear()
            raise p.ProtocolError("input_backpressure", "too many user turns are waiting for a response",
                                  event_id=event_id)
        item_id = self._input_item_id or core.new_id("item")
        self._close_client_turn(item_id)
        self._responses.commit_user_item(item_id)
        reservation = core.state.audio_buffer.prepare_commit(
            operation_id=f"commit-{self._append_seq}", chunk_period_ms=round(core.capabilities.unit_ms)
        )
        request_id = await self._submit(reservation, final=True)
        core.drop_input_request()  # sealed: the next turn's input opens its own
        core.committed_turns += 1
        self._last_turn_audio, self._turn_audio = self._turn_audio, TurnAudio()
        core.state.input_since_commit = False
        core.state.speech_since_commit = False
        self._input_item_id = None
        self._responses.queue_turn(core.committed_turns, item_id, request_id)
        if create_response:
            self._responses.start_next_turn()
        else:
            core.state.deferred_response_create = True

    def _close_client_turn(self, item_id: str) -> None:
        if self._client_turn_open:
            self._client_turn_open = False
            self._core.emit(p.SpeechStopped(self._client_audio_ms, item_id))

    def response_create(self, command: p.ResponseCreate) -> None:
        """Answer the oldest committed turn, else the function outputs the model has not answered
        (a continuation); with neither, there is nothing to answer."""
        core, responses = self._core, self._responses
        options = response_tool_options(command.response, event_id=command.event_id)
        if options and not core.capabilities.supports_tools:
            raise p.ProtocolError("tools_unsupported", f"the model {core.capabilities.plugin_id!r} cannot call tools",
                                  event_id=command.event_id)
        say = given_text(command.response, event_id=command.event_id)
        if say is not None:
            if not core.capabilities.speaks_given_text:
                raise p.ProtocolError("say_unsupported", f"the model {core.capabilities.plugin_id!r} cannot say a "
                                      "given text", event_id=command.event_id, param="response.say")
            # Said after the turns and outputs waiting for an answer, once the floor is free.
            responses.request_say({**options, RESPONSE_SAY: say}, command.event_id)
        elif responses.pending_turns:
            core.state.deferred_response_create = False
            responses.give_next_turn_options(options)
        elif responses.unanswered_outputs or responses.continuation is not None:
            responses.request_continuation(options, command.event_id)
        else:
            raise p.ProtocolError("no_committed_input", "commit input audio before response.create",
                                  event_id=command.event_id)
        responses.start_next_turn()


class TurnAudio:
    """A turn's model-rate audio, its latest ``MAX_S`` kept (a turn that long did not end too soon)."""

    MAX_S = 30.0

    def __init__(self) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self._samples = 0

    def __bool__(self) -> bool:
        return self._samples > 0

    def add(self, audio: np.ndarray, rate: int) -> None:
        self._chunks.append(audio)
        self._samples += audio.size
        while self._chunks and self._samples - self._chunks[0].size >= self.MAX_S * rate:
            self._samples -= self._chunks.popleft().size

    def take(self) -> np.ndarray:
        """All of it, which it then forgets."""
        audio = np.concatenate(list(self._chunks)) if self._chunks else np.zeros(0, np.float32)
        self.clear()
        return audio

    def clear(self) -> None:
        self._chunks.clear()
        self._samples = 0
