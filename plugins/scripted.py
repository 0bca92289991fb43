"""A scripted model: deterministic stages for tests and benchmarks of the runtime.

Turn mode has two stages: a *listener* that counts the units of a user turn and
"recognises" them as ``heard N units``, and a *speaker* that says a reply word
by word, one tone chunk per word, at a scripted pace, then makes the reply's
scripted function calls. Answering function outputs (a continuation), the speaker
says ``tool_reply`` with the newest output in it. Continuous mode has one
stage that answers every loud unit with a tone unit and yields the floor after
a few quiet ones. A ``Script`` sets the pace and injects failures; every unit
a stage receives is logged with the loop time it arrived.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from duplex_agent.plugins.contract import (
    FUNCTION_CALL,
    DefaultDuplexModelSessionState,
    DuplexAppendPlan,
    DuplexCapabilities,
    DuplexFence,
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexOutputDecision,
    DuplexSessionConfig,
    EncodeAudio,
    PrivateRuntimeKeyError,
    reject_changed_runtime_value,
    reject_private_runtime_keys,
)
from duplex_agent.plugins.engines.inprocess import InProcessEngine, PythonStage, StageRequest, StageYield
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane
from duplex_agent.plugins.unit_packetizer import UnitPacketizer

RATE = 16000
#: The newest entries the script's logs keep: a worker serving the scripted model for hours (a
#: benchmark's soak) must not keep every unit and reply it ever saw.
LOG_KEPT = 10_000


def _logged(log: list, entry: object) -> None:
    log.append(entry)
    if len(log) > 2 * LOG_KEPT:
        del log[:-LOG_KEPT]


@dataclass(slots=True)
class Script:
    input_mode: Literal["continuous", "turn"] = "turn"
    unit_samples: int = 320
    #: The speaker's reply; ``None`` answers "you said heard N units".
    reply: str | None = "one two three four five six seven eight nine ten"
    word_ms: float = 100.0
    #: Delay between spoken words (generation pace).
    word_delay_s: float = 0.0
    #: Listener refuses the unit with this 1-based submit index.
    fail_submit_at: int | None = None
    #: Speaker raises after this many words.
    fail_after_words: int | None = None
    #: Speaker says this many words of each reply, then waits for ``released`` to say the rest: a
    #: test holds a reply where it wants it on a signal, not on the pace of the words.
    hold_after_words: int | None = None
    released: asyncio.Event = field(default_factory=asyncio.Event)
    #: Speaker reports itself this far behind real time on every word.
    lag_ms: float | None = None
    #: Continuous mode: quiet units before yielding the floor.
    quiet_units_to_listen: int = 5
    silence_continuation_samples: int = 320
    #: (loop time a unit arrived, units, the silence deadline it was due at or None)
    unit_log: list[tuple[float, int, float | None]] = field(default_factory=list)
    submits: int = 0
    #: What the model keeps of the conversation: heard words, then function items as
    #: ``function_call NAME ARGUMENTS`` and ``function_call_output OUTPUT``.
    context: list[str] = field(default_factory=list)
    #: Function calls each turn's reply makes after its words: ``{"name", "arguments"}`` (a dict or
    #: JSON text), with a ``call_id`` of its own if the test wants one.
    calls: list[dict[str, Any]] = field(default_factory=list)
    #: The calls come after this many words of the reply (None: after all of them).
    calls_after_words: int | None = None
    #: What the speaker says answering function outputs; ``{output}`` is the newest output.
    tool_reply: str = "the tool says {output}"
    supports_tools: bool = True
    replies_to_tool_output: bool = False
    #: Each continuation's ``response_options`` (the ``response.create``'s own tools), as planned.
    continuation_options: list[dict[str, object]] = field(default_factory=list)


class ListenerStage(PythonStage):
    def __init__(self, script: Script) -> None:
        self.script = script

    def accept(self, payload: object) -> None:
        self.script.submits += 1
        if self.script.fail_submit_at == self.script.submits:
            raise RuntimeError("scripted submit failure")

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        units = loud = quiet = 0
        async for payload in request.inputs():
            assert isinstance(payload, dict)
            audio = np.frombuffer(payload["audio"], dtype="<f4")
            units += int(payload["units"])
            _logged(self.script.unit_log,
                    (asyncio.get_running_loop().time(), int(payload["units"]), payload.get("duplex_silence_deadline")))
            is_loud = float(np.abs(audio).max(initial=0.0)) > 0.05 and not payload.get("force_listen")
            loud += is_loud
            if self.script.input_mode != "continuous":
                continue
            if is_loud:
                quiet = 0
                yield StageYield({"audio": _tone(audio.size / RATE * 1000.0), "text": "mm"})
            else:
                quiet += 1
                if quiet == self.script.quiet_units_to_listen:
                    yield StageYield({"listen": True})
        if self.script.input_mode == "turn":
            yield StageYield({"transcript": f"heard {units} units" if loud else ""}, finished=True)


class SpeakerStage(PythonStage):
    def __init__(self, script: Script) -> None:
        self.script = script

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        spoken = 0
        async for payload in request.inputs():
            if not isinstance(payload, dict):
                continue
            calls: list[dict[str, Any]] = []
            if payload.get("continuation"):
                outputs = payload.get("outputs") or [""]
                reply = self.script.tool_reply.format(output=outputs[-1])
            else:
                heard = str(payload.get("transcript", ""))
                reply = self.script.reply if self.script.reply is not None else f"you said {heard}"
                calls = self.script.calls
            for said, word in enumerate(reply.split()):
                if said == self.script.calls_after_words:
                    for call in calls:
                        yield _call_output(call)
                    calls = []
                if self.script.hold_after_words is not None and said >= self.script.hold_after_words:
                    await self.script.released.wait()
                if self.script.fail_after_words is not None and spoken >= self.script.fail_after_words:
                    raise RuntimeError("scripted speaker failure")
                if self.script.word_delay_s:
                    await asyncio.sleep(self.script.word_delay_s)
                spoken += 1
                metadata: dict[str, object] = {"lag_ms": self.script.lag_ms} if self.script.lag_ms else {}
                yield StageYield({"audio": _tone(self.script.word_ms), "text": word}, metadata=metadata)
            for call in calls:
                yield _call_output(call)


def _call_output(call: dict[str, Any]) -> StageYield:
    return StageYield({FUNCTION_CALL: {"call_id": call.get("call_id", f"call_{uuid.uuid4().hex[:12]}"),
                                       "name": call["name"], "arguments": call.get("arguments", {})}})


def _tone(duration_ms: float) -> np.ndarray:
    t = np.arange(int(RATE * duration_ms / 1000)) / RATE
    return (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


class ScriptedPlugin(DuplexModelPlugin):
    plugin_id = "scripted"
    private_runtime_config_keys = frozenset({"engine_seed", "stage_layout"})

    def __init__(self, encode_audio: EncodeAudio, script: Script | None = None) -> None:
        super().__init__(encode_audio)
        self.script = script or Script()
        self.silence_continuation_samples = self.script.silence_continuation_samples
        self.data_plane = SpeechDataPlane(encode_audio, sample_rate=RATE)

    def build_local_engine(self) -> InProcessEngine:
        stages: list[PythonStage] = [ListenerStage(self.script)]
        if self.script.input_mode == "turn":
            stages.append(SpeakerStage(self.script))
        return InProcessEngine(stages)

    def configure_sampling_params(self, *, runtime_config: dict[str, object], defaults: tuple[object, ...]) -> tuple[object, ...]:
        return defaults

    def plan_append(self, *, request_id: str, fence: DuplexFence, session_config: dict[str, object],
                    runtime_config: dict[str, object], seq: int, turn_seq: int, payload: object, final: bool,
                    sampling_params: object) -> DuplexAppendPlan:
        return DuplexAppendPlan(request_id, 0, fence, payload, final, resumable=not final, sampling_params=sampling_params)

    def decide_output(self, *, stage_id: int, final_stage_id: int, segment_finished: bool,
                      segment_token_ids: tuple[int, ...], segment_output_metadata: dict[str, object],
                      output: object) -> DuplexOutputDecision | None:
        if not isinstance(output, dict):
            return None
        if output.get("listen") or output.get("transcript") == "":
            return DuplexOutputDecision("listen", "no_speech" if "transcript" in output else "yield")
        if "audio" in output:
            return DuplexOutputDecision("speak")
        return None

    def user_transcript(self, *, stage_id: int, output: object, prompt: object, finished: bool) -> str | None:
        if stage_id == 0 and finished and isinstance(output, dict) and output.get("transcript"):
            return str(output["transcript"])
        return None

    def commit_model_context(self, *, session_id: str | None, assistant_text: str) -> None:
        _logged(self.script.context, assistant_text)

    def commit_model_function_item(self, *, session_id: str | None, item: Mapping[str, object]) -> None:
        if item.get("type") == "function_call":
            _logged(self.script.context, f"function_call {item.get('name')} {item.get('arguments')}")
        else:
            _logged(self.script.context, f"function_call_output {item.get('output')}")

    def runtime_config_for_function_output(self, config: DuplexSessionConfig, current: Mapping[str, object],
                                           item: Mapping[str, object]) -> dict[str, object] | None:
        """The outputs so far ride in the runtime config to the next continuation (the newest few)."""
        kept = current.get("function_outputs")
        outputs = list(kept) if isinstance(kept, list) else []
        return {**current, "function_outputs": [*outputs[-7:], item.get("output")]}

    def plan_response_continuation(self, *, request_id: str, fence: DuplexFence, session_config: dict[str, object],
                                   runtime_config: dict[str, object], turn_seq: int,
                                   response_options: dict[str, object],
                                   sampling_params: tuple[object, ...]) -> DuplexAppendPlan | None:
        if self.script.input_mode != "turn":
            return None
        _logged(self.script.continuation_options, dict(response_options))
        kept = runtime_config.get("function_outputs")
        payload = {"continuation": True, "outputs": list(kept) if isinstance(kept, list) else []}
        return DuplexAppendPlan(request_id, 1, fence, payload, True, resumable=False)

    def create_session_state(self) -> DuplexModelSessionState:
        return DefaultDuplexModelSessionState(audio_buffer=UnitPacketizer(unit_samples=self.script.unit_samples, sample_rate=RATE))

    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities:
        return DuplexCapabilities(
            plugin_id=self.plugin_id, input_sample_rate=RATE, unit_samples=self.script.unit_samples,
            output_sample_rate=RATE, max_sessions=max_sessions, input_mode=self.script.input_mode,
            supports_tools=self.script.supports_tools, replies_to_tool_output=self.script.replies_to_tool_output,
        )

    def validate_client_extra_body(self, extra_body: object) -> None:
        reject_private_runtime_keys(extra_body, self.private_runtime_config_keys,
                                    message="extra_body sets server-owned keys: ", error_cls=PrivateRuntimeKeyError)

    async def prepare_runtime_config(self, config: DuplexSessionConfig, *, model_config: object | None) -> dict[str, object]:
        return {"voice": config.voice or "tone"}

    def runtime_config_for_update(self, config: DuplexSessionConfig, current: Mapping[str, object]) -> dict[str, object]:
        reject_changed_runtime_value(config.voice or "tone", current.get("voice"), message="the voice is fixed once the session started",
                                     code="session_field_immutable")
        return dict(current)

    def data_plane_context(self, **kwargs: object) -> object:
        return kwargs

