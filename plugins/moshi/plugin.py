"""``MoshiPlugin``: Kyutai's Moshi (and Moshi-format checkpoints) as a full-duplex plugin.

Moshi listens and speaks at once in 80 ms frames at 24 kHz and decides itself when to talk,
so every unit of caller audio goes to it (continuous input) and it handles overlap itself.
Its frames run in the batched frame engine, one batch slot per session. Its text stream
says when it holds the floor: the first word opens a response (``response.speak``), a
long enough run of padding closes it (``response.listen``); the frames in between are the
response's audio, each with its word as a mark for the playback ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from duplex_agent.plugins.contract import (
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
    option,
    reject_private_runtime_keys,
)
from duplex_agent.plugins.engines.frame_batch import FrameBatchEngine
from duplex_agent.plugins.moshi.configs import FRAME_SAMPLES, SAMPLE_RATE
from duplex_agent.plugins.moshi.data_plane import MoshiDataPlane
from duplex_agent.plugins.moshi.model import MoshiSpec, SlotOutput, load_moshi
from duplex_agent.plugins.unit_packetizer import UnitPacketizer


@dataclass(slots=True)
class MoshiOptions:
    """Which Moshi checkpoint to run, and where. Weights are local files only: nothing is downloaded."""

    moshi_repo: str = option("kyutai/moshiko-pytorch-bf16", "a Hugging Face repo, read from the local cache "
                                                            "(HF_HUB_CACHE) only")
    moshi_weights: str = option("", "the LM's .safetensors file, instead of --moshi-repo")
    mimi_weights: str = option("", "the Mimi codec's .safetensors file, instead of --moshi-repo")
    moshi_tokenizer: str = option("", "the SentencePiece tokenizer .model file, instead of --moshi-repo")
    moshi_config: str = option("", "tiny: a small model with random weights (tests and demos: it babbles, and the "
                                   "page says so); a config.json path for another shape; empty: the checkpoint's own")
    device: str = option("auto", "where the model runs: auto (CUDA when there is one), cpu, cuda or cuda:N")


class MoshiPlugin(DuplexModelPlugin):
    plugin_id = "moshi"
    options_type = MoshiOptions
    private_runtime_config_keys = frozenset({"slot", "engine_seed"})
    silence_continuation_samples = FRAME_SAMPLES

    def __init__(self, encode_audio: EncodeAudio, spec: MoshiSpec | None = None, *, max_sessions: int = 4) -> None:
        super().__init__(encode_audio)
        self.spec = spec or MoshiSpec()
        self.max_sessions = max_sessions
        self.engine: FrameBatchEngine | None = None
        self.data_plane = MoshiDataPlane(encode_audio, sample_rate=SAMPLE_RATE, on_session_closed=self._release)

    def configure(self, options: MoshiOptions, *, max_sessions: int) -> None:
        """The --moshi-* and --device flags, and --max-sessions (the engine's batch size)."""
        self.spec = MoshiSpec(config=options.moshi_config, repo=options.moshi_repo,
                              moshi_weights=options.moshi_weights, mimi_weights=options.mimi_weights,
                              tokenizer=options.moshi_tokenizer, device=options.device)
        self.max_sessions = max_sessions

    def build_local_engine(self) -> FrameBatchEngine:
        model = load_moshi(self.spec, capacity=self.max_sessions)
        self.engine = FrameBatchEngine(model, thread_name="moshi-frames")
        return self.engine

    def _release(self, session_id: str) -> None:
        if self.engine is not None:
            self.engine.release_session(session_id)

    # ---- engine policy ----

    def configure_sampling_params(self, *, runtime_config: dict[str, object],
                                  defaults: tuple[object, ...]) -> tuple[object, ...]:
        return defaults

    def plan_append(self, *, request_id: str, fence: DuplexFence, session_config: dict[str, object],
                    runtime_config: dict[str, object], seq: int, turn_seq: int, payload: object, final: bool,
                    sampling_params: object) -> DuplexAppendPlan:
        return DuplexAppendPlan(request_id, 0, fence, payload, final, resumable=not final,
                                sampling_params=sampling_params)

    def decide_output(self, *, stage_id: int, final_stage_id: int, segment_finished: bool,
                      segment_token_ids: tuple[int, ...], segment_output_metadata: dict[str, object],
                      output: object) -> DuplexOutputDecision | None:
        if not isinstance(output, SlotOutput):
            return None
        if output.yielded:
            return DuplexOutputDecision("listen", "model_yielded")
        if output.speaking:
            return DuplexOutputDecision("speak")
        return None

    # ---- session policy ----

    def create_session_state(self) -> DuplexModelSessionState:
        return DefaultDuplexModelSessionState(audio_buffer=UnitPacketizer(unit_samples=FRAME_SAMPLES,
                                                                          sample_rate=SAMPLE_RATE))

    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities:
        return DuplexCapabilities(
            plugin_id=self.plugin_id, input_sample_rate=SAMPLE_RATE, unit_samples=FRAME_SAMPLES,
            output_sample_rate=SAMPLE_RATE, max_sessions=max_sessions, input_mode="continuous",
            handles_overlap=True, random_weights=self.spec.random_weights,
        )

    def validate_client_extra_body(self, extra_body: object) -> None:
        reject_private_runtime_keys(extra_body, self.private_runtime_config_keys,
                                    message="extra_body sets server-owned keys: ", error_cls=PrivateRuntimeKeyError)

    async def prepare_runtime_config(self, config: DuplexSessionConfig, *,
                                     model_config: object | None) -> dict[str, object]:
        return {}

    def runtime_config_for_update(self, config: DuplexSessionConfig,
                                  current: Mapping[str, object]) -> dict[str, object]:
        return dict(current)

    def data_plane_context(self, **kwargs: object) -> object:
        return kwargs
