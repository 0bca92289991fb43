"""What the agent's send side still plays after a pause: the worker's old 60 ms source queue against shorter ones.

One process, no room: the agent's voice source feeds a local track, read back through an audio
stream in 10 ms frames, so what is measured is only what the source holds between a capture and
WebRTC (the network and the caller's jitter buffer are the same for both and left out). Each
trial plays a tone, asks a pause at a random moment (as the barge-in gate does), and times the
pause to the first silent 10 ms frame out of the track.

Both send as the worker does (``webrtc.livekit.room``: each 20 ms frame awaited into the source,
which takes it once it holds no more than its queue, so the queue is kept filled).
``queue60``: the worker's queue before (60 ms). ``queue40``: its queue now
(``SOURCE_QUEUE_MS``, two frames). ``queue20``: one frame. The modes alternate, trial by trial.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_send_queue [--trials 40]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np
from livekit import rtc

from bench.stats import percentile
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.room import SAMPLE_RATE, SOURCE_QUEUE_MS

MODES = ("queue60", "queue40", "queue20")
QUEUE_MS = {"queue60": 60, "queue40": SOURCE_QUEUE_MS, "queue20": 20}
FRAME_SAMPLES = 960
TONE = (0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(FRAME_SAMPLES) / SAMPLE_RATE)).astype(np.int16)
SILENT = np.zeros(FRAME_SAMPLES, np.int16)


class Tone:
    """The playout's stand-in: tone frames until a pause is asked, silence from the next frame on."""

    def __init__(self) -> None:
        self.pause_asked_at: float | None = None

    def next_frame(self) -> np.ndarray:
        return TONE if self.pause_asked_at is None else SILENT


async def send(source: AgentVoiceSource, tone: Tone, stop: asyncio.Event) -> None:
    while not stop.is_set():
        frame = tone.next_frame()
        await source.capture_frame(rtc.AudioFrame(frame.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES))


async def trial(mode: str, index: int) -> float | None:
    """Pause asked -> the first silent frame out of the track, in ms (None: none within 2 s)."""
    source = AgentVoiceSource(SAMPLE_RATE, 1, queue_size_ms=QUEUE_MS[mode])
    track = rtc.LocalAudioTrack.create_audio_track(f"{mode}-{index}", source.source)
    stream = CallerAudioStream(track, SAMPLE_RATE, frame_size_ms=10)
    tone, stop = Tone(), asyncio.Event()
    heard_tone = asyncio.Event()
    quiet_at: list[float] = []

    async def read() -> None:
        async for frame in stream:
            loud = bool(np.frombuffer(frame.data, np.int16).any())
            if loud:
                heard_tone.set()
            elif tone.pause_asked_at is not None:
                quiet_at.append(time.perf_counter())
                return

    reader = asyncio.create_task(read())
    sender = asyncio.create_task(send(source, tone, stop))
    try:
        await asyncio.wait_for(heard_tone.wait(), 5)
        await asyncio.sleep(0.2 + random.uniform(0, 0.04))  # a settled stream, a random phase
        tone.pause_asked_at = time.perf_counter()
        await asyncio.wait_for(reader, 2)
    except TimeoutError:
        return None
    finally:
        stop.set()
        reader.cancel()
        await asyncio.gather(sender, reader, return_exceptions=True)
        await stream.aclose()
        await source.aclose()
    return 1000.0 * (quiet_at[0] - tone.pause_asked_at) if quiet_at else None


async def run(trials: int) -> dict[str, list[float]]:
    held: dict[str, list[float]] = {mode: [] for mode in MODES}
    for index in range(trials):
        for mode in MODES:
            ms = await trial(mode, index)
            if ms is not None:
                held[mode].append(ms)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    held = asyncio.run(run(args.trials))
    print("pause asked -> first silent 10 ms frame out of the agent's track (ms), modes alternating:")
    for mode in MODES:
        values = held[mode]
        if values:
            print(f"  {mode:9} p50 {percentile(values, 50):6.1f}  p95 {percentile(values, 95):6.1f}  "
                  f"max {max(values):6.1f}  (n={len(values)})")
        else:
            print(f"  {mode:9} no trial went quiet")


if __name__ == "__main__":
    main()
