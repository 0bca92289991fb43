"""How many Moshi conversations one device steps inside the 80 ms frame.

For batch sizes 1, 2, 4, 8, ... it builds the batched model with every slot live and times
whole frame steps (Mimi encode -> LMGen.step -> Mimi decode, one batched call each, through
the frame engine's ``tick``), after warm-up steps (which also capture moshi's CUDA graphs).
It prints step time p50/p99 per batch size and the largest batch whose p99 stays inside the
frame; on CUDA also the GPU memory each batch size took at its peak beyond what was allocated
before it (``torch.cuda.max_memory_allocated``: KV caches, streaming state, CUDA graph buffers),
per slot. The tiny config on the CPU by default; ``--full-size --device cuda`` runs Moshi 7B's
shape with random weights in bf16.

    python -m bench.moshi_batch                           # tiny, CPU, quick
    python -m bench.moshi_batch --full-size --device cuda # Moshi 7B shape on a GPU

Imports only torch, numpy, moshi (and its pure-Python needs) and the project's plugin and
engine modules: it runs on a GPU host that has torch and the wheels listed in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time

import numpy as np

from bench.report import Report
from duplex_agent.plugins.contract import DuplexAppendPlan, DuplexFence
from duplex_agent.plugins.engines.frame_batch import FrameBatchEngine
from duplex_agent.plugins.moshi.configs import FRAME_SAMPLES, SAMPLE_RATE
from duplex_agent.plugins.moshi.model import MoshiModels, MoshiSpec, load_models

FRAME_MS = 1000.0 * FRAME_SAMPLES / SAMPLE_RATE


def _caller_audio(frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME_SAMPLES) / SAMPLE_RATE
    audio = 0.3 * np.sin(2 * np.pi * (150 + 30 * seed) * t) + 0.02 * rng.standard_normal(t.size)
    return audio.astype(np.float32)


async def _measure(models: MoshiModels, batch: int, warmup: int, steps: int) -> list[float]:
    """Step times (ms) of ``steps`` frames with ``batch`` live sessions, after ``warmup`` frames."""
    model = models.batch(batch)
    total = warmup + steps
    # Every session's audio is queued up front, so the engine may hold it all.
    engine = FrameBatchEngine(model, clocked=False, max_queued_frames=total)
    for session in range(batch):
        audio = _caller_audio(total, session)
        plan = DuplexAppendPlan(f"s{session}-e0-in-1", 0, DuplexFence(0, 0),
                                {"audio": audio.tobytes(), "sample_rate": SAMPLE_RATE}, False)
        await engine.submit(plan)
    times = []
    for index in range(total):
        took = engine.tick()
        if index >= warmup:
            times.append(1000.0 * took)
    await engine.close()
    model.close()
    return times


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.moshi_batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full-size", action="store_true", help="Moshi 7B's shape, random weights (bf16 on CUDA)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    parser.add_argument("--max-batch", type=int, default=0, help="largest batch tried (default 16 tiny, 64 full)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per batch (default 60 tiny, 100 full)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (CUDA graph capture)")
    parser.add_argument("--compile", action="store_true", help="let moshi torch.compile (CUDA; slow first steps)")
    parser.add_argument("--quick", action="store_true", help="batch sizes up to 4, 20 steps each")
    args = parser.parse_args(argv)

    import torch

    max_batch = args.max_batch or (4 if args.quick else 64 if args.full_size else 16)
    steps = args.steps or (20 if args.quick else 100 if args.full_size else 60)
    spec = MoshiSpec(config="7b-random" if args.full_size else "tiny", device=args.device, compile=args.compile)
    threads = torch.get_num_threads()
    print(f"moshi batch bench: {spec.config}, device {args.device}, torch {torch.__version__} "
          f"({threads} CPU threads), {steps} steps after {args.warmup} warm-up, frame {FRAME_MS:.0f} ms", flush=True)
    cuda = args.device.startswith("cuda") and torch.cuda.is_available()
    if cuda:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        print(f"GPU: {torch.cuda.get_device_name()}, {total / 2**30:.0f} GiB", flush=True)
    started = time.perf_counter()
    models = load_models(spec)
    weights = torch.cuda.memory_allocated() if cuda else 0
    print(f"models built in {time.perf_counter() - started:.0f} s"
          + (f"; weights {weights / 2**30:.1f} GiB on the GPU" if cuda else ""), flush=True)
    rows = []
    batch = 1
    while batch <= max_batch:
        started = time.perf_counter()
        before = 0
        if cuda:
            gc.collect()  # the last batch's streaming state and graphs go before this one is counted
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        try:
            times = asyncio.run(_measure(models, batch, args.warmup, steps))
        except torch.OutOfMemoryError:
            print(f"batch {batch:4d}: out of device memory; stopping", flush=True)
            break
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        p50, p99 = _percentile(times, 50), _percentile(times, 99)
        rows.append((batch, p50, p99))
        memory = ""
        if cuda:
            took = torch.cuda.max_memory_allocated() - before
            memory = f"  GPU memory {took / 2**30:6.2f} GiB ({took / batch / 2**20:5.0f} MiB per slot)"
        print(f"batch {batch:4d}: step p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  "
              f"({p50 / batch:6.2f} ms per conversation; {'inside' if p99 <= FRAME_MS else 'OVER'} the frame)"
              f"{memory}  [{time.perf_counter() - started:.0f} s]", flush=True)
        batch *= 2
    inside = [b for b, _, p99 in rows if p99 <= FRAME_MS]
    if inside:
        print(f"largest batch whose p99 step stays inside the {FRAME_MS:.0f} ms frame: {max(inside)}")
    else:
        print(f"no batch size stepped inside the {FRAME_MS:.0f} ms frame at p99")
    # No floor: the frame is a deadline, not something measured; Moshi's own server runs one conversation.
    where = f"{spec.config} config, {torch.cuda.get_device_name() if cuda else 'CPU'}"
    report = Report("moshi_batch", quick=args.quick)
    report.add("moshi.realtime_batch", f"Moshi conversations stepped together inside the {FRAME_MS:.0f} ms frame at "
               f"p99 ({where}; batches up to {max_batch} tried)", max(inside, default=0), unit="conversations",
               n=steps, area="models")
    for batch, _, p99 in rows:
        report.add(f"moshi.step_p99.batch{batch}", f"one batched frame step, p99, {batch} conversation(s) ({where})",
                   p99, unit="ms", n=steps, area="models")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
