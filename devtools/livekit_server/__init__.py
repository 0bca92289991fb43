"""Loopback LiveKit server for tests.

Written against: livekit (python rtc SDK) 1.1.21, livekit-agents 1.8.9,
livekit-protocol 1.1.29, livekit-api 1.2.2, aiortc 1.16.0.

It speaks the v0 ("/rtc", dual peer connection) signal protocol used by the
Rust core (livekit-ffi) and the agent worker protocol ("/agent"). Media is
relayed with aiortc (decode + re-encode), data packets are relayed between
participants over SCTP data channels.
"""

from .server import LoopbackLiveKitServer

__all__ = ["LoopbackLiveKitServer"]
