"""What the caller hears after the agent was quiet: a voice source that sends silence by itself vs one that stops.

One process, the loopback LiveKit server, an agent and a caller in one room (the real livekit
SDK on both sides). The agent says 300 ms bursts of tone with quiet gaps between them (0.5 to
2 s, as between replies), and captures nothing while it is quiet. ``queued``: the worker's
source (``SOURCE_QUEUE_MS``, frames awaited into it as ``webrtc.livekit.room`` does), whose
native source sends silence by itself while nothing is captured. ``unqueued``:
``queue_size_ms=0`` (the branch ``lkcpu``'s source, the least CPU: nothing is encoded or sent
while quiet), its 10 ms frames paced by the loop, so the stream stops in the gaps. The caller
times each burst from its first frame captured to its first loud 10 ms frame heard, and counts
the loud audio it heard of it. The modes alternate, burst sequence by burst sequence.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_quiet_gap [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from livekit import rtc

from bench.call_rig import children_take_sigint, start_loopback_server
from bench.livekit_rooms import token
from bench.stats import percentile
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from duplex_agent.webrtc.livekit.room import SOURCE_QUEUE_MS

RATE = 48000
FRAME = 960
BURST_FRAMES = 15  # 300 ms
GAPS_S = (0.5, 1.0, 1.5, 2.0, 0.5, 1.0)
MODES = ("queued", "unqueued")
TONE = (0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(FRAME) / RATE)).astype(np.int16)
LOUD_RMS = 0.02


class Bursts:
    """The agent's voice: a burst of tone frames when asked, nothing captured otherwise."""

    def __init__(self, source: AgentVoiceSource, queued: bool) -> None:
        self.source, self.queued = source, queued
        self.first_sent_at: float | None = None
        self._asked = asyncio.Event()

    def say(self) -> None:
        self.first_sent_at = None
        self._asked.set()

    async def speak(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._asked.wait()
            self._asked.clear()
            self.first_sent_at = time.perf_counter()
            if self.queued:  # the worker's way: the source's queue paces the captures
                for _ in range(BURST_FRAMES):
                    await self.source.capture_frame(rtc.AudioFrame(TONE.tobytes(), RATE, 1, FRAME))
                continue
            start = loop.time()  # unqueued: 10 ms frames on the loop's clock
            for n in range(2 * BURST_FRAMES):
                part = TONE[(n % 2) * FRAME // 2 : (n % 2 + 1) * FRAME // 2]
                await self.source.capture_frame(rtc.AudioFrame(part.tobytes(), RATE, 1, FRAME // 2))
                await asyncio.sleep(max(0.0, start + (n + 1) * FRAME / RATE / 2 - loop.time()))


async def sequence(url: str, mode: str, index: int) -> list[tuple[float, float, float]]:
    """(gap before, ms to the first loud frame heard, loud ms heard) per burst."""
    agent, caller = rtc.Room(), rtc.Room()
    room = f"gap-{mode}-{index}"
    await agent.connect(url, token(room, "agent"))
    await caller.connect(url, token(room, "caller"))
    FfiRouter.shared().own_room(agent)
    FfiRouter.shared().own_room(caller)
    source = AgentVoiceSource(RATE, 1, queue_size_ms=SOURCE_QUEUE_MS if mode == "queued" else 0)
    subscribed: asyncio.Future[rtc.Track] = asyncio.get_running_loop().create_future()
    caller.on("track_subscribed", lambda track, *_: subscribed.done() or subscribed.set_result(track))
    await agent.local_participant.publish_track(
        rtc.LocalAudioTrack.create_audio_track("agent-voice", source.source),
        rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
    stream = CallerAudioStream(await asyncio.wait_for(subscribed, 20), RATE, frame_size_ms=10)
    bursts = Bursts(source, mode == "queued")
    heard: list[tuple[float, float]] = []  # (when, loud ms) of each loud frame

    async def listen() -> None:
        async for frame in stream:
            samples = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768.0
            if float(np.sqrt(np.mean(samples * samples))) > LOUD_RMS:
                heard.append((time.perf_counter(), 1000.0 * samples.size / RATE))

    listener = asyncio.create_task(listen())
    sender = asyncio.create_task(bursts.speak())
    figures: list[tuple[float, float, float]] = []
    try:
        await asyncio.sleep(1.0)
        for gap in (0.0, *GAPS_S):
            await asyncio.sleep(gap)
            bursts.say()
            await asyncio.sleep(BURST_FRAMES * FRAME / RATE + 1.5)  # the burst and time to hear it
            sent = bursts.first_sent_at
            after = [(at, ms) for at, ms in heard if sent is not None and at >= sent]
            heard.clear()
            if sent is not None and after:
                figures.append((gap, 1000.0 * (after[0][0] - sent), sum(ms for _, ms in after)))
            else:
                figures.append((gap, float("nan"), 0.0))
    finally:
        for task in (sender, listener):
            task.cancel()
        await asyncio.gather(sender, listener, return_exceptions=True)
        await stream.aclose()
        await source.aclose()
        await caller.disconnect()
        await agent.disconnect()
    return figures[1:]  # the first burst follows no gap


async def run(url: str, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    results: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    for index in range(rounds):
        for mode in MODES:
            results[mode].extend(await sequence(url, mode, index))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    children_take_sigint()
    FfiRouter.shared()
    with tempfile.TemporaryDirectory(prefix="bench-gap-") as log_dir:
        server, url = start_loopback_server(Path(log_dir), interface_ipv4())
        try:
            results = asyncio.run(run(url, args.rounds))
        finally:
            server.stop()
    burst_ms = 1000.0 * BURST_FRAMES * FRAME / RATE
    print(f"a {burst_ms:.0f} ms burst after a quiet gap: its first frame captured -> first loud "
          "frame heard, and how much of it was heard loud:")
    for mode in MODES:
        for gap in sorted(set(GAPS_S)):
            rows = [r for r in results[mode] if r[0] == gap]
            delays = [r[1] for r in rows if r[1] == r[1]]
            loud = [r[2] for r in rows]
            print(f"  {mode:9} gap {gap:3.1f} s: heard after p50 {percentile(delays, 50):6.1f} ms "
                  f"max {max(delays, default=float('nan')):6.1f} ms; heard loud p50 {percentile(loud, 50):5.0f} "
                  f"of {burst_ms:.0f} ms; not heard {sum(1 for r in rows if r[1] != r[1])} of {len(rows)}")


if __name__ == "__main__":
    main()
