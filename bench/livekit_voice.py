"""What a quiet agent's published voice costs in livekit's native media: N rooms, source queued vs not.

Each call is a thread with its own loop (as livekit-agents runs jobs), connected to a room of its
own on the loopback LiveKit server, publishing an agent voice track that stays quiet (as an agent
is for most of a call). ``queued``: a queued source (60 ms), as the worker's, with DTX refused:
livekit's native source feeds WebRTC 10 ms of silence every 10 ms, which its Opus encoder encodes
and sends, a packet every 20 ms. ``queued-dtx``: the same with DTX, as the worker publishes and
LiveKit answers it: the silence is still encoded, but sent as a packet in 200-400 ms.
``unqueued``: ``queue_size_ms=0``, whose source feeds only what is captured. The modes
alternate at each N in the same run; CPU is this process's, per thread name from ``/proc``.

Run: python -m bench.livekit_voice [--calls 4,8,16] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import tempfile
import threading
from pathlib import Path

from livekit import rtc

from bench.call_rig import children_take_sigint, start_loopback_server, thread_cpu_ticks
from bench.livekit_ffi import run_modes, threads_round
from bench.livekit_rooms import token
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

MODES = ("queued", "unqueued", "queued-dtx")
QUEUE_MS = {"queued": 60, "unqueued": 0, "queued-dtx": 60}


async def one_call(url: str, mode: str, index: int, joined: threading.Barrier, stop: threading.Event) -> None:
    room = rtc.Room()
    await room.connect(url, token(f"voice-{mode}-{index}", f"agent-{index}"))
    FfiRouter.shared().own_room(room)
    source = rtc.AudioSource(48000, 1, queue_size_ms=QUEUE_MS[mode])
    track = rtc.LocalAudioTrack.create_audio_track("agent-voice", source)
    # Behind LiveKit a track sends DTX unless it refuses it (the SDK's default is on); "queued" refuses.
    options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE, dtx=mode == "queued-dtx")
    await room.local_participant.publish_track(track, options)
    await asyncio.to_thread(joined.wait)
    while not stop.is_set():
        await asyncio.sleep(0.1)
    await source.aclose()
    await room.disconnect()


def thread_ticks() -> collections.Counter[str]:
    """This process's CPU ticks by thread name, digits folded (one entry per kind of thread)."""
    ticks: collections.Counter[str] = collections.Counter()
    for name, t in thread_cpu_ticks(os.getpid()):
        ticks[re.sub(r"\d+", "#", name)] += t
    return ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="4,8,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    calls = [int(n) for n in args.calls.split(",")]
    print("== a quiet agent's published voice: N rooms (a thread and loop each) in one process ==", flush=True)
    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    children_take_sigint()
    FfiRouter.shared()
    by_thread: dict[tuple[str, int], collections.Counter[str]] = {}
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="bench-voice-") as log_dir:
        server, url = start_loopback_server(Path(log_dir), interface_ipv4())
        try:
            def voice_round(mode: str, n: int) -> tuple[float, float]:
                joined = threading.Barrier(n + 1)
                before = thread_ticks()
                result = threads_round(lambda i, stop, _: one_call(url, mode, i, joined, stop), n, args.seconds,
                                       ready=joined)
                by_thread[mode, n] = thread_ticks() - before  # the whole round, set-up included
                return result

            results = run_modes(voice_round, MODES, calls, "captured")
        finally:
            server.stop()
    print(f"{'calls':>5} | " + " | ".join(f"{m + ' % core/call':>20}" for m in MODES) + " | unqueued / queued | dtx / queued")
    for n in calls:
        per_call = [100 * results[mode, n][0] / n for mode in MODES]
        print(f"{n:5d} | " + " | ".join(f"{v:20.2f}" for v in per_call) + f" | {per_call[1] / per_call[0]:17.2f} | {per_call[2] / per_call[0]:12.2f}")
    print("busiest threads over each whole round (CPU seconds):")
    for key, ticks in by_thread.items():
        print(f"  {key[0]:8} {key[1]:2d}: " + ", ".join(f"{name} {t / hz:.2f}" for name, t in ticks.most_common(5)))


if __name__ == "__main__":
    main()
