"""Speech synthesis with Piper (en_US joe medium voice, one CPU thread)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import numpy as np

from duplex_agent.agent.models.model_errors import require_module
from duplex_agent.agent.models.shared_model import SharedModel
from duplex_agent.plugins.reference.weights import piper_voice_paths

logger = logging.getLogger("duplex_agent.models")


class PiperSynthesizer(SharedModel):
    """Shared Piper voice; `synthesize` is synchronous and safe to call from many threads."""


    def __init__(self) -> None:
        piper = require_module("piper", "piper-tts")
        ort = require_module("onnxruntime", "onnxruntime")
        model, config = piper_voice_paths()
        logger.info("loading Piper voice from %s", model)
        start = time.perf_counter()
        # Built like PiperVoice.load, but with a one-thread session: concurrent sessions each
        # get a core from the executor instead of all fighting over every core.
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        with open(config, encoding="utf-8") as f:
            piper_config = piper.PiperConfig.from_dict(json.load(f))
        self._voice = piper.PiperVoice(
            session=ort.InferenceSession(
                str(model), sess_options=opts, providers=["CPUExecutionProvider"]
            ),
            config=piper_config,
        )
        self._unvaried = piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
        logger.info("Piper voice loaded in %.2f s", time.perf_counter() - start)

    @property
    def sample_rate(self) -> int:
        return self._voice.config.sample_rate

    def synthesize(self, text: str, *, varied: bool = True) -> Iterator[np.ndarray]:
        """Mono float32 chunks at sample_rate, one per sentence; stop iterating to stop early.

        Piper samples its prosody, so each call sounds a little different; ``varied=False``
        turns the sampling off (the same text always gives the same audio).
        """
        if not text.strip():
            return
        for chunk in self._voice.synthesize(text, syn_config=None if varied else self._unvaried):
            yield chunk.audio_float_array

    def synthesize_all(self, text: str, *, varied: bool = True) -> np.ndarray:
        chunks = list(self.synthesize(text, varied=varied))
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
