"""One process-wide listener for livekit's FFI events, handing each to the one loop that waits for it.

The livekit SDK (1.1) hands every FFI event of the process to every subscriber, and
subscribes generously: an ``AudioStream`` listens for every stream's audio events and
keeps its own; ``AudioSource.capture_frame`` subscribes with no filter for each 20 ms
frame it sends; each ``Room`` takes every event but audio and video frames (every other
room's events, every call's capture acknowledgements) and looks at each on its own
loop. With N calls in one process (jobs are threads of one worker) each of those is N x
N wake-ups, and the SDK's dispatch itself runs every subscriber's filter for every event.

``FfiRouter`` subscribes once and reads each event on the SDK's callback thread: caller
frames go by stream handle, capture acknowledgements by request id, room events by room
handle, RPC invocations by local participant handle, each to the one loop that waits for
it. Its filter returns False for everything, so the SDK queues nothing for it; the
streams, sources and rooms it takes over leave the SDK's list of subscribers. They stay
the SDK's own objects; only how their events reach them changes. Each loop gets its events
in batches (``_Inbox``), and the SDK's requests that subscribe with no filter skip what the
router took. This leans on the pinned SDK's internals (``AudioStream._ffi_queue``,
``Room._ffi_queue`` and ``Room._task``, ``AudioFrame._proto_info``, the FFI queue's lock and
``subscribe``), which tests/webrtc/test_livekit_audio.py, tests/livekit/test_room_events.py and
tests/livekit/test_ffi_router_wakeups.py check; ``webrtc.private_internals`` lists them with
the version checked.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
from collections import OrderedDict, deque
from typing import Any, NamedTuple

from livekit import rtc
from livekit.rtc import _ffi_client
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi
from livekit.rtc._utils import Queue

log = logging.getLogger("duplex_agent.livekit")

#: Capture acknowledgements that came before their request returned, kept until claimed.
_EARLY_KEPT = 256
#: Callbacks a room's local participant awaits through its room's listener (``Room._room_queue``).
_ROOM_CALLBACKS = frozenset({"publish_track", "unpublish_track"})

_Target = tuple["_Inbox", "_Gate"]

#: How long interpreter exit waits for livekit's threads to leave their callbacks into Python.
CALLBACK_DRAIN_TIMEOUT_S = 2.0


class CaptureDone(NamedTuple):
    """A capture's acknowledgement, and when it reached the SDK's callback thread (monotonic s)."""

    event: proto_ffi.FfiEvent
    arrived_at: float


class FfiRouter:
    """Routes stream events by stream handle, capture callbacks by request id, room events by room."""

    _instance: FfiRouter | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, _Target] = {}
        self._rooms: dict[int, _Target] = {}  # by room handle
        self._participants: dict[int, _Target] = {}  # a room's, by its local participant's handle
        self._captures: dict[int, tuple[_Inbox, asyncio.Future[CaptureDone]]] = {}
        self._inboxes: dict[asyncio.AbstractEventLoop, _Inbox] = {}  # one per loop that gets events
        self._early: OrderedDict[int, CaptureDone] = OrderedDict()
        self.routed = 0  # events handed to a loop (for tests and benchmarks)
        #: The last event handed to one of our loops; read by the filter below, on the same thread.
        self._taken: proto_ffi.FfiEvent | None = None
        # The SDK would use this loop only for events the filter lets through: none.
        self._unused_loop = asyncio.new_event_loop()
        queue = FfiClient.instance.queue
        queue.subscribe(self._unused_loop, filter_fn=self._route)
        # The SDK's requests (a room write, a text stream's header, write and close, attributes)
        # each subscribe with no filter for their round trip, and wait for their own callback by
        # id: meanwhile every caller frame and acknowledgement of every call in the process woke
        # that job's loop too, only to be dropped there. They now skip what this router took; it
        # is subscribed first, so it has seen each event before their filters do.
        sdk_subscribe = queue.subscribe

        def subscribe(loop: asyncio.AbstractEventLoop | None = None, filter_fn: Any = None) -> Queue[Any]:
            return sdk_subscribe(loop, filter_fn=filter_fn or self._not_taken)

        queue.subscribe = subscribe

    @classmethod
    def shared(cls) -> FfiRouter:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    # ---- on the SDK's callback thread ----

    def _route(self, event: proto_ffi.FfiEvent) -> bool:
        try:
            kind = event.WhichOneof("message")
            if kind == "audio_stream_event":
                with self._lock:
                    target = self._streams.get(event.audio_stream_event.stream_handle)
                self._deliver(event, target)
            elif kind == "room_event":
                with self._lock:
                    target = self._rooms.get(event.room_event.room_handle)
                self._deliver(event, target)
            elif kind == "rpc_method_invocation":
                with self._lock:
                    target = self._participants.get(event.rpc_method_invocation.local_participant_handle)
                self._deliver(event, target)
            elif kind in _ROOM_CALLBACKS:  # rare: each room's listener passes on only what its participant awaits
                with self._lock:
                    targets = list(self._rooms.values())
                for target in targets:
                    self._deliver(event, target)
                self._taken = None  # an SDK request may wait for it too
            elif kind == "capture_audio_frame":
                done = CaptureDone(event, time.monotonic())
                async_id = event.capture_audio_frame.async_id
                with self._lock:
                    waiter = self._captures.pop(async_id, None)
                    if waiter is None:
                        self._early[async_id] = done
                        while len(self._early) > _EARLY_KEPT:
                            self._early.popitem(last=False)
                if waiter is not None:
                    self._hand(waiter[0], _resolve, waiter[1], event, done)
        except Exception:  # never let the SDK deliver an event to our unused loop
            log.exception("routing an FFI event failed")
        return False

    def _not_taken(self, event: proto_ffi.FfiEvent) -> bool:
        return event is not self._taken

    def _deliver(self, event: proto_ffi.FfiEvent, target: _Target | None) -> None:
        if target is not None:
            self._hand(target[0], _put, target[1], event)

    def _hand(self, inbox: _Inbox, deliver: Any, into: Any, event: proto_ffi.FfiEvent, what: Any = None) -> None:
        """``deliver(into, what or event)`` on ``inbox``'s loop; the SDK's unfiltered requests skip ``event``."""
        inbox.put(deliver, into, event if what is None else what)
        self._taken = event
        self.routed += 1

    # ---- from the calls' loops ----

    def own_room(self, room: rtc.Room) -> None:
        """Let a connected ``room`` receive only its own events, through this router.

        The room's listener task (``Room._task``) acts on its own room events and on RPC
        invocations for its local participant, and passes the publish and unpublish callbacks
        on to that participant; every other request the SDK makes waits on a subscription of
        its own. So those are what the room's queue gets; it leaves the SDK's subscribers.
        """
        if not room.isconnected():
            raise RuntimeError("only a connected room's events can be routed")
        assert room._ffi_handle is not None  # a connected room holds its handle
        room_handle = room._ffi_handle.handle
        participant_handle = room.local_participant._ffi_handle.handle
        gate = _Gate(room._ffi_queue)
        target = (self._inbox(room._loop), gate)
        # Under the SDK's dispatch lock, as in own_stream: every event reaches the queue once, and
        # what the SDK scheduled for it before the switch lands before anything routed since.
        with FfiClient.instance.queue._lock:
            FfiClient.instance.queue.unsubscribe(room._ffi_queue)
            room._loop.call_soon(gate.open)
            with self._lock:
                self._rooms[room_handle] = target
                self._participants[participant_handle] = target
        room._task.add_done_callback(lambda _: self._forget_room(room_handle, participant_handle))

    def _forget_room(self, room_handle: int, participant_handle: int) -> None:
        with self._lock:
            self._rooms.pop(room_handle, None)
            self._participants.pop(participant_handle, None)

    def own_stream(self, stream: rtc.AudioStream) -> None:
        """Let ``stream`` receive only its own events, through this router."""
        loop = stream._loop
        queue: Queue[Any] = Queue()
        inbox = self._inbox(loop)
        old, stream._ffi_queue = stream._ffi_queue, queue
        gate = _Gate(queue, moved_from=old)
        # Switch over under the SDK's dispatch lock (taken before ours, as its callback thread
        # does): every event then reaches exactly one of the two queues, none is lost or doubled
        # (a frame seen twice would free its native buffer twice).
        with FfiClient.instance.queue._lock:
            FfiClient.instance.queue.unsubscribe(old)
            loop.call_soon(gate.open)
            with self._lock:
                self._streams[stream._ffi_handle.handle] = (inbox, gate)

    def forget_stream(self, handle: int) -> None:
        with self._lock:
            self._streams.pop(handle, None)

    def expect_capture(self, async_id: int) -> asyncio.Future[CaptureDone]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[CaptureDone] = loop.create_future()
        inbox = self._inbox(loop)
        with self._lock:
            early = self._early.pop(async_id, None)
            if early is None:
                self._captures[async_id] = (inbox, future)
        if early is not None:
            future.set_result(early)
        return future

    def drop_capture(self, async_id: int) -> None:
        with self._lock:
            self._captures.pop(async_id, None)

    def _inbox(self, loop: asyncio.AbstractEventLoop) -> _Inbox:
        with self._lock:
            inbox = self._inboxes.get(loop)
            if inbox is None:
                for closed in [old for old in self._inboxes if old.is_closed()]:  # a finished job's loop
                    del self._inboxes[closed]
                inbox = self._inboxes[loop] = _Inbox(loop)
            return inbox


class _Gate:
    """The queue of a stream or room the router has just taken over, shut until the events the SDK
    had already scheduled for it (before the switch, under its dispatch lock) have landed.

    Those come through the loop's ready callbacks; a routed event comes in the loop's inbox, whose
    batch may have been scheduled earlier still, for another stream or room of the same loop. Let
    through at once, it would overtake them: a room told of a participant's attributes before the
    participant itself fails on that event in the SDK's listener. So routed events wait here until
    ``open``, which the switch schedules after those deliveries."""

    def __init__(self, queue: Queue[Any], moved_from: Queue[Any] | None = None) -> None:
        self.queue = queue
        self._moved_from = moved_from  # a replaced queue, whose events go first
        self._held: list[Any] | None = []

    def put_nowait(self, event: Any) -> None:
        if self._held is None:
            self.queue.put_nowait(event)
        else:
            self._held.append(event)

    def open(self) -> None:
        if self._moved_from is not None:
            while not self._moved_from.empty():
                self.queue.put_nowait(self._moved_from.get_nowait())
        held, self._held = self._held or [], None
        for event in held:
            self.queue.put_nowait(event)


class _Inbox:
    """One loop's events, handed over in batches: one wake-up for all that came while it had not run.

    A loop woken per event (``call_soon_threadsafe``: a write to its self-pipe, an epoll return, a
    GIL hand-off) pays that for every caller frame and every capture acknowledgement; events that
    land before the loop has drained the last batch ride along with it. No lock: ``put`` runs under
    the SDK's dispatch lock (one at a time), deque appends and pops are atomic, and ``_drain``
    clears the flag before it empties the deque, so an event is either drained or schedules a drain.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque[tuple[Any, Any, Any]] = deque()
        self._scheduled = False
        self.wakeups = 0  # batches handed over (for tests and benchmarks)

    def put(self, deliver: Any, into: Any, event: Any) -> None:
        """On the SDK's callback thread: ``deliver(into, event)`` on the loop, in arrival order."""
        self._pending.append((deliver, into, event))
        if not self._scheduled:
            self._scheduled = True
            self.wakeups += 1
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        while self._pending:
            deliver, into, event = self._pending.popleft()
            deliver(into, event)


def _put(gate: _Gate, event: Any) -> None:
    gate.put_nowait(event)


def _resolve(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)


# ---- at interpreter exit ----
#
# livekit 1.1.21 disposes its FFI from an atexit hook and then lets the interpreter finalize.
# Disposing stops new callbacks, but one already under way on a tokio thread (a batch of the
# native logs, a room's last events) may still hold or want the GIL. In CPython 3.11 a thread
# that takes the GIL once finalization has begun is ended with pthread_exit, whose forced unwind
# through the native runtime's frames aborts the process ("panic in a function that cannot
# unwind", exit code 134) after everything else went well. So: dispose, then wait until no
# thread is inside the SDK's callback, while the interpreter is still whole.


def _in_ffi_callback(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "ffi_event_callback" and code.co_filename == _ffi_client.__file__:
            return True
        frame = frame.f_back
    return False


def dispose_ffi(timeout: float = CALLBACK_DRAIN_TIMEOUT_S) -> None:
    """Dispose livekit's FFI (once) and return when none of its threads is in a callback into Python."""
    client = FfiClient._instance
    if client is None:
        return
    client._dispose()  # the SDK's own shutdown (no new callbacks); once only, whichever hook runs first
    deadline = time.monotonic() + timeout
    clean = 0
    # Two looks in a row with none in a callback, the GIL released between them: a callback that
    # had already started (it began before the dispose) gets the GIL and shows up in between.
    while clean < 2:
        busy = [t for t, f in sys._current_frames().items() if _in_ffi_callback(f)]
        clean = 0 if busy else clean + 1
        if busy and time.monotonic() > deadline:
            log.warning("livekit FFI threads still in a callback at exit: %s", busy)
            return
        time.sleep(0.01)


atexit.register(dispose_ffi)
