"""A process that leaves while livekit is busy (run as a subprocess by test_ffi_exit.py).

Two rooms of a loopback call stay connected with audio flowing (a callback into Python for
every 10 ms frame and every batch of native logs); then the FFI is disposed as at exit.
Prints what it found; its exit code is the test's other half.
"""

from __future__ import annotations

import asyncio
import sys

from livekit import rtc
from livekit.rtc._ffi_client import FfiClient

from devtools.livekit_server import LoopbackLiveKitServer
from duplex_agent.webrtc.livekit import ffi_router
from tests.livekit_server_tests.peers import SineFeeder, join

MIC = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)


async def main() -> None:
    server = await LoopbackLiveKitServer().start()
    rooms: list[rtc.Room] = []
    alice = await join(server, rooms, "alice", "exit")
    bob = await join(server, rooms, "bob", "exit")
    subscribed: asyncio.Future = asyncio.get_running_loop().create_future()
    bob.on("track_subscribed", lambda track, *_: subscribed.done() or subscribed.set_result(track))
    with SineFeeder() as feeder:
        await asyncio.wait_for(alice.local_participant.publish_track(feeder.track, MIC), 30)
        stream = rtc.AudioStream(await asyncio.wait_for(subscribed, 30), sample_rate=48000, num_channels=1)
        frames = 0
        async for _ in stream:
            frames += 1
            if frames == 50:  # audio is flowing: leave now, everything still open
                break
        ffi_router.dispose_ffi()
        busy = [t for t, f in sys._current_frames().items() if ffi_router._in_ffi_callback(f)]
        print(f"disposed={FfiClient._ffi_disposed} frames={frames} in_callback={len(busy)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
