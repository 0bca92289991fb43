"""Model shapes: the tiny random-weight config for tests, benchmarks and demos, and the full Moshi 7B one.

Both are shapes the ``moshi`` package's own builders take (``LMModel`` keyword arguments and a
Mimi config dict); nothing here is model code. Mimi keeps its real strides (8*6*5*4 = 960 samples
at 25 Hz, downsampled to 12.5 Hz), so a frame is 1920 samples at 24 kHz whatever the size.
"""

from __future__ import annotations

import copy
from typing import Any

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920
#: Text tokens with no word in them: padding, and the padding that ends a word.
TEXT_PADDING_IDS = (0, 3)


def tiny_mimi_config() -> dict[str, Any]:
    seanet = {
        "channels": 1, "dimension": 32, "causal": True, "n_filters": 4, "n_residual_layers": 1,
        "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
        "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
        "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True,
    }
    return {
        "sample_rate": SAMPLE_RATE, "channels": 1, "frame_rate": 12.5, "seanet": seanet,
        "quantizer": {"dimension": 16, "n_q": 4, "bins": 64, "input_dimension": 32, "output_dimension": 32},
        "transformer": {
            "d_model": 32, "num_heads": 2, "num_layers": 1, "causal": True, "layer_scale": 0.01, "context": 25,
            "conv_layout": True, "max_period": 10000, "gating": "none", "norm": "layer_norm",
            "positional_embedding": "rope", "dim_feedforward": 64, "input_dimension": 32,
            "output_dimensions": [32],
        },
    }


def tiny_lm_config(text_card: int) -> dict[str, Any]:
    return {
        "dim": 64, "text_card": text_card, "existing_text_padding_id": 3, "n_q": 4, "dep_q": 2, "card": 64,
        "num_heads": 4, "num_layers": 2, "hidden_scale": 2, "causal": True, "layer_scale": None,
        "context": 100, "max_period": 10000, "gating": "silu", "norm": "rms_norm_f32",
        "positional_embedding": "rope", "depformer_dim": 32, "depformer_dim_feedforward": 64,
        "depformer_num_heads": 2, "depformer_num_layers": 1, "depformer_layer_scale": None,
        "depformer_multi_linear": True, "depformer_context": 2, "depformer_max_period": 10000,
        "depformer_gating": "silu", "depformer_pos_emb": "none", "depformer_weights_per_step": True,
        "delays": [0, 0, 1, 0, 1],
    }


def full_lm_config() -> dict[str, Any]:
    """Moshi 7B's shape, as the ``moshi`` package defines it for checkpoints without a config.json."""
    from moshi.models import loaders

    return copy.deepcopy(loaders._lm_kwargs)

