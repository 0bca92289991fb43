"""Starting Moshi with bad input: a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from duplex_agent.agent.app.cli import main
from duplex_agent.plugins.moshi.configs import tiny_lm_config, tiny_mimi_config
from duplex_agent.plugins.moshi.model import TINY_TEXT_CARD, MoshiSpec, load_moshi
from tests.moshi.conftest import voice_frames


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny random model saved as safetensors files (Moshi LM, Mimi), as a real checkpoint would be."""
    folder = tmp_path_factory.mktemp("tiny")
    model = load_moshi(MoshiSpec(config="tiny", device="cpu", greedy=True), capacity=1)
    lm, mimi = model._gen.lm_model, model._mimi
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, folder / "model.safetensors")
    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, folder / "mimi.safetensors")
    return folder / "model.safetensors", folder / "mimi.safetensors"


def _serve(capsys, *flags: str) -> tuple[int, str]:
    code = main(["serve", "--plugin", "moshi", "--port", "0", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_the_saved_tiny_checkpoint_loads_through_the_file_path_and_says_the_same(tiny_checkpoint):
    lm_file, mimi_file = tiny_checkpoint
    random = load_moshi(MoshiSpec(config="tiny", device="cpu", greedy=True), capacity=1)
    loaded = load_moshi(MoshiSpec(config="tiny", device="cpu", greedy=True, moshi_weights=str(lm_file),
                                  mimi_weights=str(mimi_file)), capacity=1)
    active = np.ones(1, dtype=bool)
    for frame in voice_frames(3, 6):
        a, b = random.step(frame[None], active)[0], loaded.step(frame[None], active)[0]
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.text_token, a.audio_tokens) == (b.text_token, b.audio_tokens)


def test_a_repo_missing_from_the_cache_names_the_files_and_where(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code, err = _serve(capsys, "--moshi-repo", "kyutai/moshiko-pytorch-bf16", "--device", "cpu")
    assert code == 2
    assert "kyutai/moshiko-pytorch-bf16" in err and str(tmp_path / "hub") in err
    assert "model.safetensors" in err and "tokenizer_spm_32k_3.model" in err


def test_wrong_paths_are_named(capsys, tmp_path):
    code, err = _serve(capsys, "--moshi-weights", str(tmp_path / "nope.safetensors"),
                       "--mimi-weights", str(tmp_path / "mimi.safetensors"), "--moshi-tokenizer", "", "--device", "cpu")
    assert code == 2
    assert "nope.safetensors" in err and "--moshi-tokenizer (not given)" in err


def test_a_checkpoint_of_the_wrong_shape_is_refused(capsys, tmp_path, tiny_checkpoint):
    _, mimi_file = tiny_checkpoint
    wrong = dict(tiny_lm_config(TINY_TEXT_CARD), dim=32)
    from moshi.models import loaders

    lm = loaders.get_moshi_lm(None, lm_kwargs=wrong, device="cpu", dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, tmp_path / "wrong.safetensors")
    code, err = _serve(capsys, "--moshi-config", "tiny", "--moshi-weights", str(tmp_path / "wrong.safetensors"),
                       "--mimi-weights", str(mimi_file), "--device", "cpu")
    assert code == 2
    assert "wrong.safetensors does not fit" in err and "size mismatch" in err
    assert tiny_mimi_config()  # the Mimi file was fine: only the LM is named
    assert "Mimi checkpoint" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_exits_2_with_a_message():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--plugin", "moshi",
                           "--moshi-config", "tiny", "--device", "cuda", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "--device cuda asks for a GPU" in done.stderr and "Traceback" not in done.stderr
