"""Where the scripted stage engines plug into vLLM-Omni 0.30.0, and nothing else.

Four seams, each the boundary between the orchestrator and the engine cores:

- ``OmniEngineBase._initialize_stages``: builds the scripted stage pools instead of starting
  engine-core processes (``StageRuntime``);
- ``DuplexOrchestrator._process_turn_prompt``: the stage-0 input processor (tokenizer and
  multimodal encoders) becomes "hand the prompt to the thinker as it is";
- ``OrchestratorBase._forward_to_next_stage``: the thinker->talker->code2wav hand-off, which
  builds the next stage's inputs from hidden states, hands the previous output over instead
  (still under the real ``_dispatch_or_fail_request`` guard and ``_on_stage_submitted``);
- ``OrchestratorBase._orchestration_output_handler``: the poll loop over engine-core clients
  becomes a drain of the scripted ``OutputBus`` into the real ``_handle_processed_outputs``.

Everything above them (route, handler, resume registry, DuplexOmni, orchestrator, session
manager and runner, server VAD, the Qwen3-Omni plugin) is vLLM-Omni's own code.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from vllm_omni.engine.duplex_omni_engine import DuplexOmniEngine
from vllm_omni.engine.duplex_orchestrator import DuplexOrchestrator
from vllm_omni.engine.orchestrator import OrchestratorBase
from vllm_omni.engine.stage_runtime import StageRuntimeInfo

from devtools.omni_peer.engine_record import EngineRecord
from devtools.omni_peer.scripted_stages import OutputBus, PeerScript, StageInput, build_stage_pools

_BUS_POLL_S = 0.05


def install(script: PeerScript, model_dir: str, record: EngineRecord) -> None:
    """Patch the four seams (process-wide: this process serves only the peer)."""

    def initialize_stages(engine: DuplexOmniEngine, stage_init_timeout: int) -> None:
        del stage_init_timeout
        pools, _ = build_stage_pools(script, model_dir, record)
        # No engine-core processes: nothing to supervise, nothing to shut down.
        engine._runtime = SimpleNamespace(create_membership_controller=lambda: None, shutdown=lambda: None)
        engine.num_stages = len(pools)
        engine.stage_pools = pools
        engine.stage_clients = [pool.stage_client for pool in pools]
        # The engine-level vLLM configs feed the turn-based chat renderer, which a scripted
        # checkpoint cannot back; duplex sessions read the pools' model configs only.
        engine.stage_vllm_configs = [None for _ in pools]
        engine.output_processors = [None for _ in pools]
        engine.input_processor = None
        engine.prompt_transform_func = None
        engine.prompt_expand_func = None
        engine.default_sampling_params_list = [client.default_sampling_params for client in engine.stage_clients]
        engine.stage_metadata = [
            StageRuntimeInfo(final_output=client.final_output, final_output_type=client.final_output_type,
                             stage_type=client.stage_type, model_stage=client.model_stage)
            for client in engine.stage_clients
        ]
        engine.supported_tasks = ("generate", "speech")

    def process_turn_prompt(orchestrator, request_id, stage_id, prompt, params, *, resumable=False):
        del orchestrator, stage_id, params, resumable
        return StageInput(request_id=request_id, prompt=prompt)

    async def forward_to_next_stage(orchestrator: OrchestratorBase, req_id, src_stage_id, output, req_state, *,
                                    src_replica_id=None, is_streaming_session=False, is_final_update=False):
        del src_replica_id, is_streaming_session, is_final_update
        next_stage = src_stage_id + 1

        async def hand_over() -> None:
            pool = orchestrator.stage_pools[next_stage]
            replica_id = await pool.submit_initial(req_id, req_state, StageInput(req_id, source=output))
            orchestrator._on_stage_submitted(next_stage, req_id, replica_id, req_state)
            req_state.stage_submit_ts[next_stage] = time.time()

        await orchestrator._dispatch_or_fail_request(hand_over, req_id=req_id, stage_id=next_stage,
                                                     operation="inter-stage forward")

    async def drain_output_bus(orchestrator: OrchestratorBase) -> None:
        bus: OutputBus = orchestrator.stage_pools[0].stage_client.bus
        try:
            while not orchestrator._shutdown_event.is_set():
                try:
                    stage_id, outputs = await asyncio.wait_for(bus.queue.get(), _BUS_POLL_S)
                except TimeoutError:
                    continue
                orchestrator.stage_pools[stage_id].record_output_timestamps(outputs, output_ts=time.time())
                await orchestrator._handle_processed_outputs(stage_id, 0, outputs)
        except asyncio.CancelledError:
            return

    DuplexOmniEngine._initialize_stages = initialize_stages
    DuplexOrchestrator._process_turn_prompt = process_turn_prompt
    DuplexOrchestrator._forward_to_next_stage = forward_to_next_stage
    DuplexOrchestrator._orchestration_output_handler = drain_output_bus
