"""Load times and real-time factors of the reference speech models (CPU, one thread each).

Run: python -m bench.stage_rtf [runs]
RTF = processing time / audio duration (below 1 is faster than real time).
"""

import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import soxr

from duplex_agent.agent.models.vad import SileroVadModel, VadStream
from duplex_agent.plugins.reference.asr import WhisperRecognizer
from duplex_agent.plugins.reference.tts import PiperSynthesizer

SR = 16000
TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day, and everyone was happy."


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up
    return statistics.median(timed(fn) for _ in range(runs))


def main(runs: int) -> None:
    print(f"median of {runs} runs, {os.cpu_count()} CPUs\n\nload time (first load / reload):")
    for name, cls in (("Silero VAD", SileroVadModel), ("Piper joe-medium", PiperSynthesizer),
                      ("Whisper tiny.en int8", WhisperRecognizer)):
        first = timed(cls.shared)
        print(f"  {name:22s} {first:6.2f} s / {median_time(cls, runs):6.2f} s")

    tts = PiperSynthesizer.shared()
    speech = tts.synthesize_all(TEXT)
    seconds = speech.size / tts.sample_rate
    piper_t = median_time(lambda: tts.synthesize_all(TEXT), runs)

    fox = soxr.resample(tts.synthesize_all("The quick brown fox jumps over the lazy dog"),
                        tts.sample_rate, SR).astype(np.float32)
    utterance = np.zeros(3 * SR, dtype=np.float32)  # 3.0 s: 0.2 s lead-in, then speech
    n = min(fox.size, utterance.size - SR // 5)
    utterance[SR // 5 : SR // 5 + n] = fox[:n]
    asr = WhisperRecognizer.shared()
    whisper_t = median_time(lambda: asr.transcribe(utterance), runs)

    vad_audio = np.concatenate([utterance] * 3 + [np.zeros(SR, dtype=np.float32)])  # 10 s
    vad = SileroVadModel.shared()
    vad_t = median_time(lambda: VadStream(vad).push(vad_audio), runs)

    print("\nreal-time factor:")
    print(f"  Whisper tiny.en, 3.0 s utterance   {whisper_t / 3.0:.3f}  ({whisper_t * 1000:.0f} ms)")
    print(f"  Piper, per second of speech        {piper_t / seconds:.3f}  ({seconds:.1f} s in {piper_t * 1000:.0f} ms)")
    print(f"  Silero VAD, per second of audio    {vad_t / 10.0:.4f}  (10 s in {vad_t * 1000:.0f} ms)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
