"""The livekit room-event fan-out alone: N rooms in one process, each as the SDK ships it vs routed.

Each call is a thread with its own event loop, as livekit-agents runs jobs, connected to a room of
its own on the loopback LiveKit server (its own process). Each one's agent speaks all the time
(20 ms frames captured into an audio source, paced by the source's queue; the source is not
published, so no Opus encode hides the difference) and changes its state attribute twice a
second. The SDK subscribes each room to every FFI event of the process but audio and video
frames, so every room's loop wakes for every call's capture acknowledgements and room events;
``routed``: ``webrtc.livekit.ffi_router`` hands each room only its own. Captures go through the
router in both modes, so the modes differ only in how the rooms get their events. The modes
alternate at each N in the same run; CPU is this process's, the server's left out.

Run: python -m bench.livekit_rooms [--calls 4,8,16] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from livekit import api, rtc

from bench.call_rig import API_KEY, API_SECRET, children_take_sigint, start_loopback_server
from bench.livekit_ffi import report, run_modes, threads_round
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

RATE = 48000
FRAME = rtc.AudioFrame((np.arange(960, dtype=np.int16) % 200).tobytes(), RATE, 1, 960)
MODES = ("sdk", "routed")


def token(room: str, identity: str) -> str:
    grants = api.VideoGrants(room_join=True, room=room, can_publish=True, can_subscribe=True)
    return api.AccessToken(API_KEY, API_SECRET).with_identity(identity).with_grants(grants).to_jwt()


async def one_call(url: str, mode: str, index: int, joined: threading.Barrier, stop: threading.Event,
                   captured: list[int]) -> None:
    room = rtc.Room()
    await room.connect(url, token(f"{mode}-{index}", f"agent-{index}"))
    if mode == "routed":
        FfiRouter.shared().own_room(room)
    source = AgentVoiceSource(RATE, 1, queue_size_ms=60)  # not published: no encode, only its acknowledgements
    await asyncio.to_thread(joined.wait)
    next_state = time.monotonic()
    while not stop.is_set():
        await source.capture_frame(FRAME)
        captured[index] += 1
        if time.monotonic() >= next_state:
            next_state += 0.5
            await room.local_participant.set_attributes({"lk.agent.state": f"speaking-{captured[index]}"})
    await source.aclose()
    await room.disconnect()


def run(url: str, calls: list[int], seconds: float) -> dict[tuple[str, int], tuple[float, float]]:
    def rooms_round(mode: str, n: int) -> tuple[float, float]:
        joined = threading.Barrier(n + 1)
        return threads_round(lambda i, stop, captured: one_call(url, mode, i, joined, stop, captured), n, seconds,
                             ready=joined)

    return run_modes(rooms_round, MODES, calls, "captured")


def run_and_report(calls: list[int], seconds: float) -> None:
    """The rounds against a loopback LiveKit server of their own, then the table."""
    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    children_take_sigint()
    FfiRouter.shared()  # livekit's FFI client, made on this thread: the SDK's lazy one races between threads
    with tempfile.TemporaryDirectory(prefix="bench-rooms-") as log_dir:
        server, url = start_loopback_server(Path(log_dir), interface_ipv4())
        try:
            report(run(url, calls, seconds), calls, MODES, {mode: 50.0 for mode in MODES})
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="4,8,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print("== the livekit room-event fan-out: N rooms (a thread and loop each) in one process, SDK vs routed ==")
    run_and_report([int(n) for n in args.calls.split(",")], args.seconds)


if __name__ == "__main__":
    main()
