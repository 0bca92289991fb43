"""The third-party internals this package leans on, and the one version of each package they were checked against.

Each package family's private uses live in one module, which names its version here:

- aiortc, ``webrtc.direct.aiortc_receiver``: ``RTCRtpReceiver``'s ``__decoder_queue``,
  ``__jitter_buffer`` and ``__started`` (our readers take the receiver's packets and frames).
- aioice, ``webrtc.direct.host_address``: ``aioice.ice.get_host_addresses``, replaced so
  that gathering inside ``candidates_on`` offers one address.
- livekit (the rtc SDK), ``webrtc.livekit.ffi_router`` and ``webrtc.livekit.ffi_audio``:
  ``FfiClient`` and its queue's lock, ``livekit.rtc._proto``, ``livekit.rtc._utils.Queue``,
  ``AudioStream._ffi_queue``, ``Room._ffi_queue``, ``Room._loop``, ``Room._room_queue``,
  ``_ffi_handle`` of streams, sources, rooms and participants, ``AudioFrame._proto_info``;
  also ``agent.app.livekit_worker`` creates the ``FfiClient`` once on the main thread.

Outside the installed package, the loopback SFU under devtools/ keeps its own aiortc
seams (devtools/livekit_server/aiortc_seams.py), checked against the same aiortc.

pyproject.toml pins each package to the range of its checked version, and
tests/packaging/test_private_internals.py checks that the installed ones are these.
"""

from __future__ import annotations

#: package (its distribution name) -> the version its internals were checked against
CHECKED_VERSIONS: dict[str, str] = {
    "aiortc": "1.16.0",
    "aioice": "0.13.0",
    "livekit": "1.1.21",
}
