"""The agent's voice source read back through its own local track: livekit's send side, no room.

What comes out of the stream is what the source sent, 10 ms tick by tick (no network, no
Opus), so tests and benches can see exactly what a capture, a pause or a clear did.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from livekit import rtc

from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.media.playout import SAMPLE_RATE


@contextlib.asynccontextmanager
async def looped_back(name: str, *, queue_size_ms: int,
                      frame_size_ms: int = 10) -> AsyncIterator[tuple[AgentVoiceSource, CallerAudioStream]]:
    """A voice source with a ``queue_size_ms`` queue, and a stream of its own track in ``frame_size_ms`` frames."""
    source = AgentVoiceSource(SAMPLE_RATE, 1, queue_size_ms=queue_size_ms)
    track = rtc.LocalAudioTrack.create_audio_track(name, source.source)
    stream = CallerAudioStream(track, SAMPLE_RATE, frame_size_ms=frame_size_ms)
    try:
        yield source, stream
    finally:
        await stream.aclose()
        await source.aclose()


async def cancel(*tasks: asyncio.Task) -> None:
    """Cancel ``tasks`` and wait for them to end."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
