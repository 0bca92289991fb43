"""A connected room's FFI subscription, narrowed to the events of that room.

The livekit SDK (1.1) subscribes each ``rtc.Room`` to every FFI event of the process
except audio and video frames: the events of every other room, and every call's capture
acknowledgements (50 a second while its agent speaks). Each one wakes the room's loop,
which looks at it, hands it to the room's participants and drops it. With N calls in one
worker that is N x N wake-ups, so the CPU per call grows with N.

``narrow_room_events`` lets through only what the room's listener acts on (the pinned
SDK's ``Room._listen_task``): its own room events, RPC invocations for its local
participant, and the publish and unpublish callbacks its local participant waits for.
Every other request the SDK makes (captures, attributes, text streams) waits on a
subscription of its own. tests/livekit/test_room_events.py checks this against the SDK.
"""

from __future__ import annotations

from livekit import rtc
from livekit.rtc._ffi_client import FfiClient
from livekit.rtc._proto import ffi_pb2 as proto_ffi

#: Callbacks the local participant awaits through the room's listener (``_room_queue``).
_ROOM_CALLBACKS = frozenset({"publish_track", "unpublish_track"})


def narrow_room_events(room: rtc.Room) -> None:
    """Let ``room``'s loop wake only for its own events. Call once it is connected."""
    if not room.isconnected():
        raise RuntimeError("only a connected room's FFI subscription can be narrowed")
    room_handle = room._ffi_handle.handle
    participant_handle = room.local_participant._ffi_handle.handle

    def ours(event: proto_ffi.FfiEvent) -> bool:
        kind = event.WhichOneof("message")
        if kind == "room_event":
            return event.room_event.room_handle == room_handle
        if kind == "rpc_method_invocation":
            return event.rpc_method_invocation.local_participant_handle == participant_handle
        return kind in _ROOM_CALLBACKS

    queue = FfiClient.instance.queue
    with queue._lock:
        for i, (subscriber, loop, _) in enumerate(queue._subscribers):
            if subscriber is room._ffi_queue:
                queue._subscribers[i] = (subscriber, loop, ours)
                return
    raise RuntimeError("the room's FFI subscription is not among the SDK's subscribers")
