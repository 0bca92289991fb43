"""Loopback LiveKit server for tests.

Written against: livekit (python rtc SDK) 1.1.21, livekit-agents 1.8.9,
livekit-protocol 1.1.29, livekit-api 1.2.2, aiortc 1.16.0.

It speaks the v0 ("/rtc", dual peer connection) signal protocol used by the
Rust core (livekit-ffi) and the agent worker protocol ("/agent"). Audio RTP is
forwarded as it arrives, as LiveKit's SFU does (``media_relay.AudioForwarder``; the
aiortc internals it relies on are in ``aiortc_seams``); its answer to a publisher turns Opus
DTX on unless the track refused it, as LiveKit's does (``publisher_answer``), so quiet tracks
send what they send behind LiveKit. Unlike LiveKit it negotiates no RED (aiortc has none):
a publisher that asks for RED sends plain Opus here. Data packets are relayed
between participants over SCTP data channels. In a test, ``LoopbackLiveKitServer``
runs it on a thread and event loop of its own; ``python -m devtools.livekit_server``
runs it as a process.
"""

from .server_thread import LoopbackLiveKitServer

__all__ = ["LoopbackLiveKitServer"]
