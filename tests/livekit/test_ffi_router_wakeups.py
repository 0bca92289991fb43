"""What FfiRouter wakes a loop for: its own events, in order, several per wake-up; an SDK request waits for its callback alone."""

import asyncio
import threading

import pytest
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2

from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

pytestmark = pytest.mark.asyncio


def _frame_event(handle: int, n: int) -> ffi_pb2.FfiEvent:
    event = ffi_pb2.FfiEvent()
    event.audio_stream_event.stream_handle = handle
    event.audio_stream_event.frame_received.frame.handle.id = n
    return event


class _Stream:
    """What own_stream reads off an SDK stream; its queue is subscribed as a stream's is, and own_stream takes it off."""

    def __init__(self, handle: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._ffi_queue = FfiClient.instance.queue.subscribe(self._loop, filter_fn=lambda _: False)
        self._ffi_handle = type("Handle", (), {"handle": handle})()


async def test_events_routed_from_another_thread_arrive_in_order_with_fewer_wake_ups_than_events():
    router = FfiRouter.shared()
    stream = _Stream(770001)
    router.own_stream(stream)
    inbox = router._inbox(asyncio.get_running_loop())
    wakeups = inbox.wakeups
    events = 200
    # The loop is held (it waits on the thread's join), so all but the first event land in a
    # batch that is already scheduled: the way a busy job loop receives them.
    sender = threading.Thread(target=lambda: [router._route(_frame_event(770001, n)) for n in range(events)])
    sender.start()
    sender.join()
    got = [(await asyncio.wait_for(stream._ffi_queue.get(), 5)).audio_stream_event.frame_received.frame.handle.id
           for _ in range(events)]
    assert got == list(range(events))
    assert 1 <= inbox.wakeups - wakeups < events
    router.forget_stream(770001)


async def test_a_capture_acknowledgement_and_a_frame_for_one_loop_share_its_inbox():
    router = FfiRouter.shared()
    stream = _Stream(770002)
    router.own_stream(stream)
    waiting = router.expect_capture(880002)
    ack = ffi_pb2.FfiEvent()
    ack.capture_audio_frame.async_id = 880002
    await asyncio.to_thread(lambda: (router._route(_frame_event(770002, 1)), router._route(ack)))
    assert (await asyncio.wait_for(waiting, 5)).event.capture_audio_frame.async_id == 880002
    frame = await asyncio.wait_for(stream._ffi_queue.get(), 5)
    assert frame.audio_stream_event.frame_received.frame.handle.id == 1
    router.drop_capture(880002)
    router.forget_stream(770002)


async def test_an_sdk_request_waiting_for_its_callback_is_not_woken_for_the_calls_frames():
    router = FfiRouter.shared()
    stream = _Stream(770003)
    router.own_stream(stream)
    request = FfiClient.instance.queue.subscribe()  # as each room write does: no filter, for its round trip
    callback = ffi_pb2.FfiEvent()
    callback.set_local_attributes.async_id = 880003
    try:
        # The SDK's callback thread: ten of a call's frames, then the request's own callback.
        await asyncio.to_thread(lambda: [FfiClient.instance.queue.put(e)
                                         for e in [*(_frame_event(770003, n) for n in range(10)), callback]])
        first = await asyncio.wait_for(request.get(), 5)
        assert first.WhichOneof("message") == "set_local_attributes"
        assert request.empty()
        frames = [await asyncio.wait_for(stream._ffi_queue.get(), 5) for _ in range(10)]
        assert [f.audio_stream_event.frame_received.frame.handle.id for f in frames] == list(range(10))
    finally:
        FfiClient.instance.queue.unsubscribe(request)
        router.forget_stream(770003)


class _Room:
    """What own_room reads off a connected SDK room; its queue is subscribed as Room.connect subscribes it."""

    def __init__(self, handle: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._ffi_queue = FfiClient.instance.queue.subscribe(
            self._loop, filter_fn=lambda e: e.WhichOneof("message") not in ("audio_stream_event", "video_stream_event"))
        self._ffi_handle = type("Handle", (), {"handle": handle})()
        self.local_participant = type("Participant", (), {"_ffi_handle": type("Handle", (), {"handle": handle + 1})()})()
        self._task = self._loop.create_future()

    def isconnected(self) -> bool:
        return True


def _room_event(handle: int, kind: str, identity: str) -> ffi_pb2.FfiEvent:
    event = ffi_pb2.FfiEvent()
    event.room_event.room_handle = handle
    if kind == "participant_connected":
        event.room_event.participant_connected.info.info.identity = identity
    else:
        event.room_event.participant_attributes_changed.participant_identity = identity
    return event


async def test_a_room_taken_over_while_the_loops_inbox_is_busy_gets_its_events_in_the_sdks_order():
    router = FfiRouter.shared()
    busy = _Stream(770004)
    router.own_stream(busy)
    room = _Room(660004)
    try:
        # What the SDK's callback thread delivers while the room's loop is busy (here: this test,
        # which does not yield until all is done) and the room is taken over: another call's frame
        # (the loop's inbox now has a batch scheduled), the agent joining (the SDK delivers it to the
        # room's own queue: not routed yet), the switch, then the agent's attributes (routed).
        put = FfiClient.instance.queue.put
        put(_frame_event(770004, 1))
        put(_room_event(660004, "participant_connected", "agent"))
        router.own_room(room)
        put(_room_event(660004, "participant_attributes_changed", "agent"))
        got = [(await asyncio.wait_for(room._ffi_queue.get(), 5)).room_event.WhichOneof("message") for _ in range(2)]
        assert got == ["participant_connected", "participant_attributes_changed"]
    finally:
        room._task.set_result(None)
        router.forget_stream(770004)


async def test_a_stream_taken_over_while_the_loops_inbox_is_busy_gets_its_frames_in_order():
    router = FfiRouter.shared()
    busy = _Stream(770005)
    router.own_stream(busy)
    stream = _Stream(770006)
    stream._ffi_queue = FfiClient.instance.queue.subscribe(  # as an SDK stream keeps its own frames
        stream._loop, filter_fn=lambda e: e.audio_stream_event.stream_handle == 770006)
    try:
        put = FfiClient.instance.queue.put  # as above: all before the loop runs again
        put(_frame_event(770005, 1))
        put(_frame_event(770006, 1))  # to the stream's own queue: not routed yet
        router.own_stream(stream)
        put(_frame_event(770006, 2))  # routed, riding the busy batch
        got = [(await asyncio.wait_for(stream._ffi_queue.get(), 5)).audio_stream_event.frame_received.frame.handle.id
               for _ in range(2)]
        assert got == [1, 2]
    finally:
        router.forget_stream(770005)
        router.forget_stream(770006)
