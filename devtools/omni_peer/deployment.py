"""The peer's deployment on disk: a model directory with Qwen3-Omni's config only, and a deploy yaml.

The model directory holds the checkpoint's ``config.json`` (from transformers' own
``Qwen3OmniMoeConfig`` defaults), so vLLM-Omni resolves its real Qwen3-Omni pipeline and
duplex plugin from it; there are no weights. The deploy yaml extends vLLM-Omni's own
``qwen3_omni_duplex.yaml`` with the session limits, the server VAD model shipped by the
``silero-vad`` package, and ``async_chunk: false`` (stages hand over through the
orchestrator, where the scripted stages plug in, not through shared-memory connectors).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def silero_vad_model() -> str:
    import silero_vad

    return str(Path(silero_vad.__file__).parent / "data" / "silero_vad.onnx")


def write_deployment(workdir: str, *, max_sessions: int, disconnect_grace_s: float) -> tuple[str, str]:
    import vllm_omni
    from transformers import Qwen3OmniMoeConfig

    model_dir = os.path.join(workdir, "qwen3-omni-scripted")
    config = Qwen3OmniMoeConfig()
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    config.save_pretrained(model_dir)

    base = Path(vllm_omni.__file__).parent / "deploy" / "qwen3_omni_duplex.yaml"
    deploy = {
        "base_config": str(base),
        "async_chunk": False,
        "duplex_session": {
            "max_sessions": max_sessions,
            "disconnect_grace_s": disconnect_grace_s,
            "server_vad_model_path": silero_vad_model(),
        },
    }
    deploy_path = os.path.join(workdir, "deploy.yaml")
    with open(deploy_path, "w") as handle:
        yaml.safe_dump(deploy, handle)
    return model_dir, deploy_path
