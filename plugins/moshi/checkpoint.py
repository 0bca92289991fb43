"""Where a Moshi-format checkpoint's files are: explicit paths, or a Hugging Face repo in the local cache.

Nothing is downloaded: a repo is read from the cache only (``try_to_load_from_cache``), so a file
that is not there stops the start with a ``ModelStartError`` naming what was looked for and where.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from duplex_agent.agent.models.model_errors import ModelStartError

DEFAULT_REPO = "kyutai/moshiko-pytorch-bf16"
# The file names Kyutai's repos use when their config.json names none (the moshi package's defaults).
MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    moshi_weights: Path
    mimi_weights: Path
    #: None only for the tiny config, which names its text tokens itself.
    tokenizer: Path | None
    #: The LM's keyword arguments from the repo's or the given config.json; None means Moshi 7B's shape.
    lm_config: dict | None = None


def explicit_files(moshi_weights: str, mimi_weights: str, tokenizer: str, *, need_tokenizer: bool,
                   lm_config: dict | None = None) -> CheckpointFiles:
    """Files named on the command line; each must exist."""
    wanted = {"--moshi-weights": moshi_weights, "--mimi-weights": mimi_weights}
    if need_tokenizer or tokenizer:
        wanted["--moshi-tokenizer"] = tokenizer
    missing = [f"{flag} {path or '(not given)'}" for flag, path in wanted.items() if not path or not Path(path).is_file()]
    if missing:
        raise ModelStartError("Moshi checkpoint files not found: " + "; ".join(missing))
    return CheckpointFiles(Path(moshi_weights), Path(mimi_weights), Path(tokenizer) if tokenizer else None, lm_config)


def cached_repo_files(repo: str, *, cache_dir: str | None = None) -> CheckpointFiles:
    """A repo's files from the local Hugging Face cache (config.json, when present, names them)."""
    from huggingface_hub import constants, try_to_load_from_cache

    where = cache_dir or constants.HF_HUB_CACHE

    def lookup(name: str) -> Path | None:
        found = try_to_load_from_cache(repo, name, cache_dir=cache_dir)
        return Path(found) if isinstance(found, str) else None

    lm_config = None
    names = {"moshi_name": MOSHI_NAME, "mimi_name": MIMI_NAME, "tokenizer_name": TOKENIZER_NAME}
    config_path = lookup("config.json")
    if config_path is not None:
        lm_config = config_from_file(config_path)
        for key in names:
            names[key] = lm_config.pop(key, names[key])
    paths = {key: lookup(name) for key, name in names.items()}
    missing = [names[key] for key, path in paths.items() if path is None]
    if missing:
        raise ModelStartError(
            f"Moshi checkpoint {repo!r} is not in the local Hugging Face cache ({where}): missing "
            + ", ".join(missing)
            + ". Nothing is downloaded at run time: fetch it beforehand (huggingface-cli download "
            + f"{repo}), or give --moshi-weights, --mimi-weights and --moshi-tokenizer."
        )
    return CheckpointFiles(paths["moshi_name"], paths["mimi_name"], paths["tokenizer_name"], lm_config)  # type: ignore[arg-type]


def config_from_file(path: Path | str) -> dict:
    """An LM config.json as the moshi package reads it, less the keys that are not LM arguments."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelStartError(f"Moshi config {path} cannot be read: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelStartError(f"Moshi config {path} is not a JSON object")
    for key in ("model_type", "lm_gen_config", "tts_config", "stt_config", "model_id", "mimi_config_name",
                "lora_name"):
        config.pop(key, None)
    return config
