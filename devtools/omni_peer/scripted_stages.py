"""The scripted stage engines: what Qwen3-Omni's three engine cores would hand the orchestrator.

In production each stage pool replica is a client of an engine-core process (thinker, talker,
code2wav on GPUs); the pool's output processor turns their raw outputs into vLLM
``RequestOutput``s. Here each replica is a ``ScriptedEngineClient`` that produces those
``RequestOutput``s itself, on the orchestrator's loop, and puts them on one ``OutputBus`` that
the orchestrator's output loop drains (see ``orchestrator_seams``):

- thinker (stage 0): the reply's text as DELTA outputs, one word a step;
- talker (stage 1): one codec frame per word as token ids, then finished;
- code2wav (stage 2): the audio, chunk by chunk, paced in real time at the model's rate.

The pool itself is vLLM-Omni's ``StagePool`` (bindings, replica choice, abort routing, stage
metrics stay real); only the entry submit skips the output processor the scripted outputs
no longer need.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm_omni.engine.stage_pool import StagePool
from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput

from devtools.omni_peer import scripted_calls
from devtools.omni_peer.engine_record import EngineRecord
from devtools.omni_peer.scripted_model import prompt_messages, reply_text, word_audio

STAGE_NAMES = ("thinker", "talker", "code2wav")
#: How long the scripted thinker takes per word, and code2wav per audio chunk (beyond real time).
THINKER_STEP_S = 0.02
AUDIO_CHUNK_S = 0.08


@dataclass
class PeerScript:
    """What the peer's model does: its output rate, and whether it speaks at all."""

    sample_rate: int = 24000
    text_only: bool = False
    word_count: int = 3
    #: Calls the thinker makes per caller turn in a session with tools (``--tools``; see ``scripted_calls``).
    calls_per_reply: int = 1


@dataclass
class StageInput:
    """What the orchestrator hands a stage: the prompt (stage 0) or the previous stage's output."""

    request_id: str
    prompt: Any = None
    source: RequestOutput | None = None


@dataclass
class OutputBus:
    """The one queue every scripted engine core writes and the orchestrator's output loop reads."""

    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    #: The full thinker text per request, which the talker reads (the real talker gets hidden states).
    replies: dict[str, tuple[int, str]] = field(default_factory=dict)

    def put(self, stage_id: int, output: RequestOutput) -> None:
        self.queue.put_nowait((stage_id, [output]))


class ScriptedEngineClient:
    """One stage's engine core, scripted: ``add_request_async`` starts a generation task."""

    stage_type = "llm"
    custom_process_input_func = None
    prompt_transform_func = None
    prompt_expand_func = None
    requires_multimodal_data = False

    def __init__(self, stage_id: int, script: PeerScript, bus: OutputBus, record: EngineRecord) -> None:
        self.stage_id = stage_id
        self.model_stage = STAGE_NAMES[stage_id]
        self.final_output = stage_id in (0, 2)
        self.final_output_type = "audio" if stage_id == 2 else "text"
        self.default_sampling_params = SamplingParams(temperature=0.0, max_tokens=2048,
                                                      output_kind=RequestOutputKind.DELTA)
        self.script = script
        self.bus = bus
        self.record = record
        self._tasks: dict[str, asyncio.Task] = {}

    async def add_request_async(self, request: StageInput) -> None:
        generate = (self._think, self._talk, self._speak)[self.stage_id]
        if self.stage_id:
            self.record.write(self.model_stage, request.request_id, "started")
        task = asyncio.create_task(generate(request), name=f"scripted-{self.model_stage}-{request.request_id}")
        self._tasks[request.request_id] = task
        task.add_done_callback(lambda done, rid=request.request_id: self._forget(rid, done))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            task = self._tasks.pop(request_id, None)
            if task is not None:
                if not task.done():
                    self.record.write(self.model_stage, request_id, "aborted")
                task.cancel()

    def _forget(self, request_id: str, task: asyncio.Task) -> None:
        if self._tasks.get(request_id) is task:
            del self._tasks[request_id]

    def check_health(self) -> None:
        """Alive for as long as the process is: a scripted core cannot die on its own."""

    def shutdown(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    # ---- the three engine cores ----

    async def _think(self, request: StageInput) -> None:
        given = request.prompt or {}
        prompt = str(given.get("prompt", ""))
        index, text = reply_text(prompt, word_count=self.script.word_count)
        outputs = given.get(scripted_calls.OUTPUTS_KEY)
        answers = scripted_calls.outputs_for_turn(index, outputs) or scripted_calls.outputs_for_turn(index - 1, outputs)
        calls = [] if answers else scripted_calls.calls_for_turn(
            index, given.get(scripted_calls.TOOLS_KEY), given.get(scripted_calls.TOOL_CHOICE_KEY),
            request_id=request.request_id, count=_count(given.get(scripted_calls.CALLS_KEY), self.script.calls_per_reply))
        if answers:
            text = f"reply {index} " + " ".join(answers)
        elif calls:
            # The model says it is looking, and calls while it speaks (as a voice agent does).
            text = f"reply {index} {scripted_calls.PREAMBLE}"
        self.record.write(self.model_stage, request.request_id, "started", conversation=prompt_messages(prompt),
                          reply=text, calls=[call.as_dict() for call in calls])
        if calls:
            await asyncio.sleep(THINKER_STEP_S)
            self.bus.put(0, _text_output(request.request_id, scripted_calls.encode_calls(calls), [999],
                                         finished=False))
        self.bus.replies[request.request_id] = (index, text)
        words = text.split(" ")
        for position, word in enumerate(words):
            await asyncio.sleep(THINKER_STEP_S)
            last = position == len(words) - 1
            delta = word if position == 0 else " " + word
            self.bus.put(0, _text_output(request.request_id, delta, [1000 + position], finished=last))
        self.record.write(self.model_stage, request.request_id, "finished")

    async def _talk(self, request: StageInput) -> None:
        index, text = self.bus.replies.get(request.request_id, (1, ""))
        # "reply N" is not spoken, nor more than a reply's words (a long tool output stays text).
        words = [] if self.script.text_only else text.split(" ")[2:2 + self.script.word_count]
        await asyncio.sleep(THINKER_STEP_S)
        codes = [index * 100 + position for position in range(len(words))]
        self.bus.put(1, _text_output(request.request_id, "", codes, finished=True))
        self.record.write(self.model_stage, request.request_id, "finished", codes=len(codes))

    async def _speak(self, request: StageInput) -> None:
        index, _ = self.bus.replies.pop(request.request_id, (1, ""))
        codes = list(getattr(request.source.outputs[0], "token_ids", ()) if request.source else ())
        rate = self.script.sample_rate
        audio = np.concatenate([word_audio(index, rate) for _ in codes]) if codes else np.zeros(0, np.float32)
        chunk = int(AUDIO_CHUNK_S * rate)
        started = time.monotonic()
        offsets = range(0, len(audio), chunk) if len(audio) else [0]
        for number, offset in enumerate(offsets):
            # Real time: chunk k is ready when chunk k-1 would have finished playing.
            await asyncio.sleep(max(0.0, started + number * AUDIO_CHUNK_S - time.monotonic()))
            piece = audio[offset:offset + chunk]
            last = offset + chunk >= len(audio)
            self.bus.put(2, _audio_output(request.request_id, piece, rate, finished=last))
        self.record.write(self.model_stage, request.request_id, "finished", audio_s=round(len(audio) / rate, 3))


class ScriptedStagePool(StagePool):
    """vLLM-Omni's stage pool over one scripted replica; outputs arrive already processed."""

    async def submit_initial(self, request_id, req_state, request, *, prompt_text=None,
                             affinity_request_id=None, submit_kwargs=None, params_override=None) -> int:
        del req_state, prompt_text, submit_kwargs, params_override
        replica_id = await self._pick_or_select(request_id, affinity_request_id=affinity_request_id)
        await self.clients[replica_id].add_request_async(request)
        return replica_id

    async def submit_update(self, request_id, req_state, request, **kwargs) -> int:
        raise RuntimeError(f"the scripted stage {self.stage_id} takes no streaming updates ({request_id})")


def build_stage_pools(script: PeerScript, model_dir: str,
                      record: EngineRecord) -> tuple[list[ScriptedStagePool], OutputBus]:
    bus = OutputBus()
    pools = []
    for stage_id, name in enumerate(STAGE_NAMES):
        model_config = SimpleNamespace(model=model_dir, model_stage=name, trust_remote_code=False, revision=None)
        pools.append(ScriptedStagePool(stage_id, ScriptedEngineClient(stage_id, script, bus, record),
                                       stage_vllm_config=SimpleNamespace(model_config=model_config)))
    return pools, bus


def _count(asked: object, default: int) -> int:
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else default


def _text_output(request_id: str, text: str, token_ids: list[int], *, finished: bool) -> RequestOutput:
    completion = CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None,
                                  logprobs=None, finish_reason="stop" if finished else None)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[0], prompt_logprobs=None,
                         outputs=[completion], finished=finished)


def _audio_output(request_id: str, audio: np.ndarray, rate: int, *, finished: bool) -> RequestOutput:
    completion = MultimodalCompletionOutput(
        multimodal_output={"audio": torch.from_numpy(np.ascontiguousarray(audio)), "sr": rate},
        index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None,
        finish_reason="stop" if finished else None)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[0], prompt_logprobs=None,
                         outputs=[completion], finished=finished)
