"""Real livekit SDK peers for the loopback server's tests."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from livekit import rtc

from devtools.livekit_server import LoopbackLiveKitServer


async def join(server: LoopbackLiveKitServer, rooms: list[rtc.Room], identity: str,
               room: str, options: rtc.RoomOptions | None = None, **token_kw) -> rtc.Room:
    r = rtc.Room()
    rooms.append(r)
    token = server.mint_token(identity, room, **token_kw)
    await asyncio.wait_for(r.connect(server.url, token, options or rtc.RoomOptions()), 15)
    return r


def inbound_rtp(stats) -> list:
    """What a room received, per stream: on the v1 signal path (one peer connection) the SDK
    reports it under its publisher's stats, on v0 under its subscriber's."""
    return [s.inbound_rtp for s in (*stats.subscriber_stats, *stats.publisher_stats)
            if s.WhichOneof("stats") == "inbound_rtp"]


class SineFeeder:
    """Publishes a 440 Hz sine through an rtc.AudioSource in real time."""

    def __init__(self, freq: float = 440.0) -> None:
        self.source = rtc.AudioSource(48000, 1)
        self.track = rtc.LocalAudioTrack.create_audio_track("mic", self.source)
        self._freq = freq
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        n, t = 480, 0
        while True:
            x = np.sin(2 * np.pi * self._freq * (np.arange(n) + t) / 48000) * 8000
            t += n
            await self.source.capture_frame(rtc.AudioFrame(x.astype(np.int16).tobytes(), 48000, 1, n))

    def __enter__(self) -> SineFeeder:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()


def future() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


def resolve(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


async def eventually(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)
