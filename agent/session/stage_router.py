"""The stage router: where a stage's outputs go.

Each watched stage request has a reader task that only posts what arrives
(``StageOutputArrived``, then ``StageStreamEnded``) into the session's mailbox;
the mailbox task routes it. An output of an older epoch is dropped. A current
one goes through the plugin's decision (listen, speak, finish), to the client
through the data plane when it is the final stage's (or the plugin projects
it), and on to the next stage's request. A function call the data plane projects
is announced as a response of its own (``function_calls``), with or without a
response speaking.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.function_calls import FunctionCalls
from duplex_agent.agent.session.ledger import TextMark
from duplex_agent.agent.session.responses import ActiveResponse, ContinuationDue, ResponseManager
from duplex_agent.plugins.contract import (
    FUNCTION_CALL,
    FUNCTION_CALL_DONE,
    DuplexAppendPlan,
    DuplexFence,
    PartialStageForward,
)
from duplex_agent.plugins.contract.engine import EngineSubmitError, StageOutput

log = logging.getLogger("duplex_agent.runner")


@dataclass(slots=True)
class StageStream:
    """Runner-side state of one stage request."""

    request_id: str
    stage_id: int
    fence: DuplexFence
    turn_id: int
    response: ActiveResponse | None
    req_state: dict[str, Any] = field(default_factory=dict)
    forwarded_partial: bool = False


@dataclass(frozen=True, slots=True)
class StageOutputArrived:
    """Mailbox command: one output of a watched stage request."""

    stream: StageStream
    output: StageOutput
    event_id: None = None


@dataclass(frozen=True, slots=True)
class StageStreamEnded:
    """Mailbox command: a watched request's output stream ended (``error`` if reading it raised)."""

    stream: StageStream
    error: BaseException | None = None
    event_id: None = None


class StageRouter:
    def __init__(self, core: SessionCore, responses: ResponseManager, calls: FunctionCalls) -> None:
        self._core = core
        self._responses = responses
        self._calls = calls
        self.dropped_stale_outputs = 0

    def watch(self, request_id: str, stage_id: int, response: ActiveResponse | None) -> None:
        core = self._core
        stream = StageStream(request_id, stage_id, core.fence, core.turn_id, response)
        if response is not None and response.options:
            stream.req_state["response_options"] = dict(response.options)
        core.plugin.data_plane.begin_request(request_id)
        core.spawn(self._read(stream))

    async def continue_response(self, due: ContinuationDue) -> None:
        """Mailbox: a continuation's response is open: submit its plan, then read what it says."""
        response, plan = due.response, due.plan
        if response is not self._responses.active:  # cancelled before its plan went in
            return
        try:
            await self._core.engine.submit(plan)
        except EngineSubmitError as exc:
            await self._responses.fail(response, "stage_failed", str(exc))
            return
        self.watch(plan.request_id, plan.stage_id, response)

    async def _read(self, stream: StageStream) -> None:
        """The reader task: posts each output, then the end; it changes nothing itself."""
        post = self._core.post
        try:
            async for output in self._core.engine.outputs(stream.request_id):
                post(StageOutputArrived(stream, output))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            post(StageStreamEnded(stream, exc))
        else:
            post(StageStreamEnded(stream))

    async def route(self, arrived: StageOutputArrived) -> None:
        """Mailbox: route one output; a plugin or engine exception fails the response it serves."""
        stream = arrived.stream
        if not stream.fence.admits(self._core.fence):
            self.dropped_stale_outputs += 1
            return
        try:
            await self._on_output(stream, arrived.output)
        except Exception as exc:
            log.exception("session %s: routing an output of %s failed", self._core.session_id, stream.request_id)
            await self._fail(stream, "plugin_error", f"the model plugin failed: {type(exc).__name__}: {exc}")

    async def end(self, ended: StageStreamEnded) -> None:
        """Mailbox: a request's output stream is over."""
        stream = ended.stream
        self._core.plugin.data_plane.close_stream(stream.request_id)
        if ended.error is not None and stream.fence.admits(self._core.fence):
            log.error("session %s: reading %s failed: %r", self._core.session_id, stream.request_id, ended.error)
            await self._fail(stream, "stage_failed", f"stage {stream.stage_id} failed: {ended.error}")

    async def _fail(self, stream: StageStream, code: str, message: str) -> None:
        responses = self._responses
        response = stream.response or (responses.active if self._core.continuous else None)
        if response is not None and response is responses.active:
            await responses.fail(response, code, message)
        else:
            self._core.error(code, message, None, error_type="server_error")

    async def _on_output(self, stream: StageStream, out: StageOutput) -> None:
        core, responses, plugin = self._core, self._responses, self._core.plugin
        final_stage = core.engine.stage_count - 1
        if out.error is not None:  # the engine's message for the caller (and its log has the detail)
            await self._fail(stream, "stage_failed", out.error)
            return
        if lag := out.metadata.get("lag_ms"):
            core.emit(p.SessionLagging(f"stage{out.stage_id}", float(lag)))  # type: ignore[arg-type]
        transcript = plugin.user_transcript(stage_id=out.stage_id, output=out.output, prompt=None, finished=out.finished)
        if transcript is not None:
            responses.user_transcript(stream.turn_id, transcript)
        decision = plugin.decide_output(
            stage_id=out.stage_id,
            final_stage_id=final_stage,
            segment_finished=out.finished,
            segment_token_ids=out.token_ids,
            segment_output_metadata=dict(out.metadata),
            output=out.output,
        )
        response = stream.response
        if decision is not None and decision.action == "listen":
            if response is None and responses.active is not None and core.continuous:
                response = responses.active
            core.emit(p.ResponseListen(response.response_id if response else None, decision.reason))
            if response is not None:
                await core.engine.abort(response.request_ids - {stream.request_id})
                responses.finish(response, "completed", decision.reason or "listen")
            return
        if decision is not None and decision.action in ("speak", "finish") and response is None:
            response = responses.active or responses.open(core.turn_id)
            response.request_ids.add(stream.request_id)
        if response is not None and decision is not None and not response.spoke:
            response.spoke = True
            core.emit(p.ResponseSpeak(response.response_id))
        projects = out.stage_id == final_stage or plugin.projects_intermediate_outputs or \
            plugin.project_intermediate_output(stage_id=out.stage_id, output=out.output, context=None)
        # A call needs no response speaking: it is a response of its own.
        calls = response is None and isinstance(out.output, dict) and FUNCTION_CALL in out.output
        if projects and (response is responses.active if response is not None else calls):
            self._project(response, out)
        if out.stage_id < final_stage and response is not None:
            await self._forward(stream, out)
        if response is not None and (
            (out.stage_id == final_stage and out.finished and not core.continuous)
            or (decision is not None and decision.action == "finish")
        ):
            responses.finish(response, "completed")

    def _project(self, response: ActiveResponse | None, out: StageOutput) -> None:
        core = self._core
        context = core.plugin.data_plane_context(
            epoch=core.epoch,
            turn_id=core.turn_id,
            active_response_turn_id=response.turn_id if response else None,
            active_response_id=response.response_id if response else None,
            auto_responds=core.auto_responds,
            response_format=core.config.output_audio_format,
            speed=None,
            modalities=core.config.modalities,
        )
        # Wire events: each one's fields are read by its kind, as the data plane wrote them.
        items: Iterable[dict[str, Any]] = core.plugin.data_plane.project(out, context=context)
        for item in items:
            kind = item.get("type")
            if kind == FUNCTION_CALL_DONE:
                self._calls.announce(item, response)
                continue
            if response is None:
                continue
            if kind == "response.output_audio.delta":
                if item["delta"] is None:
                    continue
                marks = [TextMark(str(m["text"]), float(m["start_ms"]), float(m["end_ms"]))
                         for m in item.get("marks", [])]
                duration = float(item["audio_ms"])
                start = response.ledger.record_audio(duration, marks)
                core.emit(p.ResponseAudioDelta(
                    response.response_id, response.item_id, item["delta"], int(item["sample_rate"]),
                    start, duration, [{"text": m.text, "start_ms": m.start_ms + start, "end_ms": m.end_ms + start}
                                      for m in marks],
                ))
            elif kind == "response.output_audio_transcript.delta":
                response.ledger.record_text(str(item["delta"]))
                core.emit(p.ResponseTranscriptDelta(response.response_id, response.item_id, str(item["delta"])))

    async def _forward(self, stream: StageStream, out: StageOutput) -> None:
        """Pass a stage's output downstream: partial updates if the plugin makes them, else at its end."""
        plugin = self._core.plugin
        stream.req_state["finished"] = out.finished  # the plugin's cue to close what it forwards
        forward = plugin.plan_partial_stage_output(self, out.stage_id, 0, out.output, stream.req_state)
        if forward is not None:
            stream.forwarded_partial = True
        elif out.finished and not stream.forwarded_partial:
            forward = PartialStageForward(output=out.output, is_final_update=True)
        if forward is None:
            return
        await self._submit_downstream(stream, forward)
        followup = plugin.partial_stage_followup(forward, stream.req_state)
        if followup is not None:
            await self._submit_downstream(stream, followup)

    async def _submit_downstream(self, stream: StageStream, forward: PartialStageForward) -> None:
        core = self._core
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
            sampling_params=core.sampling[next_stage] if len(core.sampling) > next_stage else None,
        )
        try:
            await core.engine.submit(plan)
        except EngineSubmitError as exc:
            await self._fail(stream, "stage_failed", str(exc))
            return
        if opened:
            response.request_ids.add(str(request_id))
            child = StageStream(str(request_id), next_stage, stream.fence, stream.turn_id, response)
            core.plugin.data_plane.begin_request(str(request_id))
            core.spawn(self._read(child))
