"""A track published just as the server asks for a receiving section is offered all the same.

On the v1 signal path (one peer connection) the server asks a participant for receiving sections
(``MediaSectionsRequirement``) when it subscribes to a track, and the SDK offers again after its
debounce period. A track published while that offer is being made needs one more offer. LiveKit
tells every publisher ``fast_publish`` in its join, and the SDK then queues that negotiation; on
its debounced path it drops it, and the track is never offered: its subscriber hears nothing.
"""

from __future__ import annotations

import asyncio
import random

from livekit import rtc

from devtools.livekit_server import LoopbackLiveKitServer
from devtools.livekit_server.participant import Participant

from .peers import SineFeeder, future, join, resolve

# The rust SDK's publisher negotiation period: the offer it makes after the server's ask starts
# about this long after it, and the publish below lands in the few milliseconds that offer takes.
SDK_NEGOTIATION_PERIOD_S = 0.15
TRIALS = 20


async def _caller_hears_the_agent(server: LoopbackLiveKitServer, asked: dict[str, asyncio.Event],
                                  room: str) -> bool:
    """Whether the caller receives the agent's track, published just as the server asks the agent
    for a section to receive the caller's."""
    rooms: list[rtc.Room] = []
    try:
        with SineFeeder() as feeder:
            caller = await join(server, rooms, "caller", room)
            heard = future()
            caller.on("track_subscribed", lambda track, pub, p: resolve(heard, p.identity))
            await caller.local_participant.publish_track(
                feeder.track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
            asked["agent"] = asyncio.Event()
            agent = await join(server, rooms, "agent", room)
            await asyncio.wait_for(asked["agent"].wait(), 10)
            await asyncio.sleep(SDK_NEGOTIATION_PERIOD_S + random.uniform(-0.002, 0.008))
            voice = rtc.LocalAudioTrack.create_audio_track("voice", rtc.AudioSource(48000, 1))
            await agent.local_participant.publish_track(
                voice, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
            try:
                return await asyncio.wait_for(heard, 10) == "agent"
            except TimeoutError:
                return False
    finally:
        await asyncio.gather(*(asyncio.wait_for(r.disconnect(), 20) for r in rooms))


async def test_a_track_published_as_the_server_asks_for_a_section_reaches_its_subscriber(
        server: LoopbackLiveKitServer, monkeypatch) -> None:
    asked: dict[str, asyncio.Event] = {}
    send = Participant.send

    async def noting_asks(self: Participant, msg) -> None:  # noqa: ANN001
        if msg.WhichOneof("message") == "media_sections_requirement" and self.identity in asked:
            asked[self.identity].set()
        await send(self, msg)

    monkeypatch.setattr(Participant, "send", noting_asks)
    silent = [trial for trial in range(TRIALS)
              if not await _caller_hears_the_agent(server, asked, f"room-{trial}")]
    assert not silent, f"trials whose caller never received the agent's track: {silent}"
