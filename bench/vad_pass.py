"""VAD cost per call: Silero through onnxruntime twice (the old path: edge onset and turn
detection each ran it) against the native Silero of livekit-local-inference once (one
pass per call), on the same Piper speech, in the same run.

Run: python -m bench.vad_pass [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import numpy as np

from devtools.speech import speak
from duplex_agent.agent.models.vad import WINDOW_SAMPLES, SileroVadModel

WINDOWS_PER_S = 16000 / WINDOW_SAMPLES


def onnx_silero():  # noqa: ANN201
    import onnxruntime as ort

    spec = importlib.util.find_spec("livekit.plugins.silero")
    if spec is None or not spec.submodule_search_locations:
        return None
    weights = Path(spec.submodule_search_locations[0], "resources/silero_vad.onnx").read_bytes()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(weights, sess_options=opts, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    window = np.zeros((1, 64 + WINDOW_SAMPLES), np.float32)
    rate = np.array(16000, dtype=np.int64)

    def score(samples: np.ndarray) -> None:
        nonlocal state
        window[0, :64] = window[0, -64:]
        window[0, 64:] = samples
        _, state = session.run(None, {"input": window, "state": state, "sr": rate})

    return score


def cpu_us_per_window(score, audio: np.ndarray) -> float:  # noqa: ANN001
    windows = audio.size // WINDOW_SAMPLES
    started = time.process_time()
    for i in range(windows):
        score(audio[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES])
    return 1e6 * (time.process_time() - started) / windows


def main(rounds: int) -> None:
    audio = np.concatenate([speak("The quick brown fox jumps over the lazy dog, and then it runs away."),
                            np.zeros(16000, np.float32)] * 3)
    native_stream = SileroVadModel.shared().open_stream()
    onnx = onnx_silero()
    native, old = [], []
    for _ in range(rounds):  # interleaved, so both meet the same load
        native.append(cpu_us_per_window(native_stream.probability, audio))
        if onnx is not None:
            old.append(cpu_us_per_window(onnx, audio))
    n = float(np.median(native))
    print(f"VAD, CPU per 32 ms window (median of {rounds} rounds over {audio.size / 16000:.0f} s of speech):")
    print(f"  native Silero (livekit-local-inference): {n:6.1f} us")
    print(f"  per call, one pass:      {n * WINDOWS_PER_S / 1e4:.3f} % of a core")
    if old:
        o = float(np.median(old))
        print(f"  Silero via onnxruntime:  {o:6.1f} us  ({o / n:.1f}x the native)")
        print(f"  per call before, two ONNX passes (edge onset + turn detection): {2 * o * WINDOWS_PER_S / 1e4:.3f} % "
              f"of a core; after, one native pass: {n * WINDOWS_PER_S / 1e4:.3f} %")
    else:
        print("  (livekit-plugins-silero not installed: no ONNX comparison)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(3 if parser.parse_args().quick else 9)
