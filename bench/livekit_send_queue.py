"""What the agent's send side still plays after a pause: the worker's source queue, taken back or played on.

One process, no room: the agent's voice source feeds a local track, read back through an audio
stream in 10 ms frames, so what is measured is only what the source holds between a capture and
WebRTC (the network and the caller's jitter buffer are the same for every mode and left out).
Each trial plays a reply from a ``PlayoutQueue``, pauses it at a random moment (as the barge-in
gate does), and times the pause to the first silent 10 ms frame out of the track.

Every mode sends as the worker does (each 20 ms frame awaited into the source, which takes it
once it holds no more than its queue, so the queue is kept filled). ``taken back``: the worker
now (``AgentVoiceSource.play``, ``SOURCE_QUEUE_MS``): at the pause the source's queue is emptied
and its audio goes back to the playout. ``played on``: the same queue left to play out, as
before. ``queue20``: one frame of queue, played on. The modes alternate, trial by trial.

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
from devtools.voice_loopback import cancel, looped_back
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.room import SAMPLE_RATE, SOURCE_QUEUE_MS
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, PlayoutQueue

MODES = ("taken back", "played on", "queue20")
QUEUE_MS = {"taken back": SOURCE_QUEUE_MS, "played on": SOURCE_QUEUE_MS, "queue20": 20}
REPLY = (0.3 * np.sin(2 * np.pi * 440 * np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE)).astype(np.float32)


async def play_on(source: AgentVoiceSource, playout: PlayoutQueue) -> None:
    """The worker's send loop before: what the source holds plays out after a pause."""
    while True:
        pcm = playout.next_frame()
        await source.capture_frame(rtc.AudioFrame(pcm.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES))


async def trial(mode: str, index: int) -> float | None:
    """Pause asked -> the first silent frame out of the track, in ms (None: none within 2 s)."""
    playout = PlayoutQueue()
    playout.capture(REPLY, "reply")
    heard_reply = asyncio.Event()
    paused_at: list[float] = []
    quiet_at: list[float] = []

    async def read(stream: CallerAudioStream) -> None:
        async for frame in stream:
            loud = bool(np.frombuffer(frame.data, np.int16).any())
            if loud:
                heard_reply.set()
            elif paused_at:
                quiet_at.append(time.perf_counter())
                return

    async with looped_back(f"{mode}-{index}", queue_size_ms=QUEUE_MS[mode]) as (source, stream):
        reader = asyncio.create_task(read(stream))
        sender = asyncio.create_task(source.play(playout, playout.next_frame) if mode == "taken back"
                                     else play_on(source, playout))
        try:
            await asyncio.wait_for(heard_reply.wait(), 5)
            await asyncio.sleep(0.2 + random.uniform(0, 0.04))  # a settled stream, a random phase
            paused_at.append(time.perf_counter())
            playout.pause()
            await asyncio.wait_for(reader, 2)
        except TimeoutError:
            return None
        finally:
            await cancel(sender, reader)
    return 1000.0 * (quiet_at[0] - paused_at[0]) if quiet_at else None


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
            print(f"  {mode:10} p50 {percentile(values, 50):6.1f}  p95 {percentile(values, 95):6.1f}  "
                  f"max {max(values):6.1f}  (n={len(values)})")
        else:
            print(f"  {mode:10} no trial went quiet")


if __name__ == "__main__":
    main()
