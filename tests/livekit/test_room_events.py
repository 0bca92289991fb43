"""A room routed by FfiRouter (real SDK, loopback LiveKit server) wakes for its own events only, and still works."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from livekit import rtc
from livekit.rtc._ffi_client import FfiClient

from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from tests.support.waits import until

pytestmark = pytest.mark.asyncio


class Delivered:
    """The FFI events put on a room's queue (each one a wake-up of the room's loop)."""

    def __init__(self, room: rtc.Room) -> None:
        self.handle = room._ffi_handle.handle
        self.kinds: list[str] = []
        queue = room._ffi_queue
        put = queue.put_nowait

        def counted(event) -> None:
            kind = event.WhichOneof("message")
            if kind == "room_event":
                kind = "own room_event" if event.room_event.room_handle == self.handle else "other room's room_event"
            self.kinds.append(kind)
            put(event)

        queue.put_nowait = counted

    def foreign(self) -> list[str]:
        return [k for k in self.kinds if k not in ("own room_event", "publish_track", "unpublish_track")]


async def _joined(server, identity: str, room_name: str) -> rtc.Room:
    room = rtc.Room()
    await asyncio.wait_for(room.connect(server.url, server.mint_token(identity, room_name)), 20)
    return room


async def test_a_routed_room_wakes_only_for_its_own_events_and_still_works(livekit_server):
    router = FfiRouter.shared()
    routed = await _joined(livekit_server, "routed", "a")
    as_shipped = await _joined(livekit_server, "as-shipped", "c")
    busy = await _joined(livekit_server, "busy", "b")
    subscribers = len(FfiClient.instance.queue._subscribers)
    router.own_room(routed)
    # It left the SDK's subscribers, whose filters run for every event of the process.
    assert len(FfiClient.instance.queue._subscribers) == subscribers - 1
    seen_routed, seen_as_shipped = Delivered(routed), Delivered(as_shipped)

    # Another call in the process: its agent speaks (capture acknowledgements) and changes state
    # (attributes: room events of its own room).
    source = rtc.AudioSource(48000, 1, queue_size_ms=100)
    track = rtc.LocalAudioTrack.create_audio_track("voice", source)
    await busy.local_participant.publish_track(track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
    frame = rtc.AudioFrame((np.arange(960, dtype=np.int16) % 200).tobytes(), 48000, 1, 960)
    for i in range(50):
        await source.capture_frame(frame)
        if i % 10 == 0:
            await busy.local_participant.set_attributes({"lk.agent.state": f"speaking-{i}"})
    # The room as the SDK ships it woke for those: the signal that they reached this process.
    await until(lambda: "capture_audio_frame" in seen_as_shipped.kinds
                   and "other room's room_event" in seen_as_shipped.kinds, 10, "the other call's events")
    assert seen_routed.foreign() == []

    # Its own events still arrive: a participant joins its room and publishes.
    joined = asyncio.Event()
    published = asyncio.Event()
    routed.on("participant_connected", lambda p: joined.set())
    routed.on("track_published", lambda pub, p: published.set())
    caller = await _joined(livekit_server, "caller", "a")
    caller_source = rtc.AudioSource(48000, 1)
    await caller.local_participant.publish_track(
        rtc.LocalAudioTrack.create_audio_track("mic", caller_source),
        rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
    await asyncio.wait_for(asyncio.gather(joined.wait(), published.wait()), 10)
    # Its own requests answered through the room's listener still complete.
    own_source = rtc.AudioSource(48000, 1)
    publication = await asyncio.wait_for(routed.local_participant.publish_track(
        rtc.LocalAudioTrack.create_audio_track("agent", own_source),
        rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)), 10)
    await asyncio.wait_for(routed.local_participant.unpublish_track(publication.sid), 10)
    assert "own room_event" in seen_routed.kinds and "publish_track" in seen_routed.kinds
    assert seen_routed.foreign() == []

    # Leaving ends the room's listener (its end-of-stream event came through the router), and the
    # router forgets the room.
    for room in (caller, busy, as_shipped, routed):
        await asyncio.wait_for(room.disconnect(), 10)
    await asyncio.wait_for(routed._task, 10)
    assert routed._ffi_handle.handle not in router._rooms
    for s in (source, caller_source, own_source):
        await s.aclose()


async def test_routing_a_room_that_is_not_connected_says_so():
    with pytest.raises(RuntimeError, match="connected"):
        FfiRouter.shared().own_room(rtc.Room())
