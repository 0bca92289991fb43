"""The livekit FFI audio fan-out alone: N calls' audio in and out of one process, SDK as shipped vs ours.

Each call is a thread with its own event loop, as livekit-agents runs jobs: it feeds
20 ms frames into an audio source (paced by the source's 60 ms queue) and reads the
source's track back through an audio stream, so every frame crosses the FFI twice,
as the worker's caller audio and agent voice do. No room and no SFU: only the
process's share of the FFI event traffic, which is what grew with the square of
the calls. ``sdk``: ``rtc.AudioSource.capture_frame`` and ``rtc.AudioStream`` (10 ms
frames); ``ours``: ``webrtc.livekit.ffi_audio`` (one routed listener, 20 ms frames).
The modes alternate at each N in the same run.

Run: python -m bench.livekit_ffi [--calls 4,8,16] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from livekit import rtc

from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream

RATE = 48000
FRAME = np.zeros(960, np.int16)
FRAME[::7] = 300  # not silence, so nothing along the way can skip it


async def one_call(mode: str, stop: threading.Event, frames_read: list[int], index: int) -> None:
    ours = mode == "ours"
    source = AgentVoiceSource(RATE, 1, queue_size_ms=60) if ours else rtc.AudioSource(RATE, 1, queue_size_ms=60)
    track = rtc.LocalAudioTrack.create_audio_track(f"call-{index}", source.source if ours else source)
    stream = CallerAudioStream(track, RATE) if ours else rtc.AudioStream(track, sample_rate=RATE, num_channels=1)

    async def read() -> None:
        async for _ in stream:
            frames_read[index] += 1

    reader = asyncio.create_task(read())
    while not stop.is_set():
        await source.capture_frame(rtc.AudioFrame(FRAME.tobytes(), RATE, 1, 960))
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await stream.aclose()
    await source.aclose()


def threads_round(one_call: Callable[[int, threading.Event, list[int]], Coroutine[Any, Any, None]], calls: int,
                  seconds: float, *, warmup: float = 1.0, ready: threading.Barrier | None = None) -> tuple[float, float]:
    """N calls, each a thread with its own event loop running ``one_call(index, stop, counts)``, as
    livekit-agents runs jobs: (cores this process used, counts per call per second) over the steady
    window. With ``ready``, the window's warm-up starts once every call has reached it too."""
    stop = threading.Event()
    counts = [0] * calls
    threads = [threading.Thread(target=asyncio.run, args=(one_call(i, stop, counts),), daemon=True)
               for i in range(calls)]
    for thread in threads:
        thread.start()
    if ready is not None:
        ready.wait(timeout=60)
    time.sleep(warmup)
    counted0, cpu0, wall0 = sum(counts), time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu, wall, counted = time.process_time() - cpu0, time.perf_counter() - wall0, sum(counts) - counted0
    stop.set()
    for thread in threads:
        thread.join(20)
    return cpu / wall, counted / wall / calls


def run_modes(round_of: Callable[[str, int], tuple[float, float]], modes: tuple[str, ...], calls: list[int],
              frames: str) -> dict[tuple[str, int], tuple[float, float]]:
    """Each N, every mode in turn (same run): ``round_of(mode, N)``, printed as it ends."""
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for n in calls:
        for mode in modes:
            results[mode, n] = round_of(mode, n)
            cores, rate = results[mode, n]
            print(f"   ... {mode:6} {n:2d} calls: {cores:.3f} cores, {100 * cores / n:.2f}% per call, "
                  f"{rate:.0f} frames {frames} per call per s", flush=True)
    return results


def run(calls: list[int], seconds: float) -> dict[tuple[str, int], tuple[float, float]]:
    return run_modes(lambda mode, n: threads_round(lambda i, stop, frames: one_call(mode, stop, frames, i), n, seconds),
                     ("sdk", "ours"), calls, "read")


#: Frames each call's stream hands out per second in real time: the SDK's are 10 ms, ours 20 ms.
FRAMES_PER_S = {"sdk": 100.0, "ours": 50.0}


def kept_up(rate: float, expected: float) -> bool:
    """A round whose calls handled under 90 % of their frames in real time fell behind: the process
    could not do the work, so its CPU per call is too low to compare."""
    return rate >= 0.9 * expected


def report(results: dict[tuple[str, int], tuple[float, float]], calls: list[int],
           modes: tuple[str, str] = ("sdk", "ours"), frames_per_s: dict[str, float] = FRAMES_PER_S) -> None:
    """The two modes' CPU per call side by side, and each one's growth over the call counts it kept up at."""
    base, ours = modes
    print(f"{'calls':>5} | {base + ' % core/call':>18} | {ours + ' % core/call':>18} | {ours + ' / ' + base:>14}")
    for n in calls:
        a, b = 100 * results[base, n][0] / n, 100 * results[ours, n][0] / n
        behind = [f"{mode} fell behind: {results[mode, n][1]:.0f} of {frames_per_s[mode]:.0f} frames a second"
                  for mode in modes if not kept_up(results[mode, n][1], frames_per_s[mode])]
        print(f"{n:5d} | {a:18.2f} | {b:18.2f} | {b / a:14.2f}" + (f"   [{'; '.join(behind)}]" if behind else ""))
    for mode in modes:
        measured = [n for n in calls if kept_up(results[mode, n][1], frames_per_s[mode])]
        if len(measured) < 2:
            print(f"{mode}: fewer than two call counts kept up with real time: no growth figure")
            continue
        lo, hi = min(measured), max(measured)
        growth = (results[mode, hi][0] / hi) / (results[mode, lo][0] / lo)
        left_out = sorted(set(calls) - set(measured))
        print(f"{mode}: per call at {hi} over per call at {lo}: {growth:.2f}x"
              + (f" (left out, fell behind: {', '.join(map(str, left_out))} calls)" if left_out else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="4,8,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    calls = [int(n) for n in args.calls.split(",")]
    print("== the livekit FFI audio fan-out: N calls (a thread and loop each) in one process, SDK vs ours ==")
    report(run(calls, args.seconds), calls)


if __name__ == "__main__":
    main()
