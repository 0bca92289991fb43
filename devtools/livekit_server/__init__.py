"""Loopback LiveKit server for tests.

Written against: livekit (python rtc SDK) 1.1.21, livekit-agents 1.8.9,
livekit-protocol 1.1.29, livekit-api 1.2.2, aiortc 1.16.0.

It speaks both signal protocols livekit-server serves: v1 ("/rtc/v1", one peer
connection), which the SDKs ask for first (the Rust core behind livekit, livekit-client),
and v0 ("/rtc", two peer connections), their fallback; and the agent worker protocol
("/agent"). Every request it answers is recorded (``http_requests``), so a test can show
that an SDK asked for nothing it lacks. Audio RTP is
forwarded as it arrives, as LiveKit's SFU does (``media_relay.AudioForwarder``; the
aiortc internals it relies on are in ``aiortc_seams``). Its audio settings are LiveKit's,
so tracks carry what they carry behind LiveKit: its answer to a publisher lets Opus add
in-band FEC, turns DTX on unless the track refused it and puts RED first unless the track
refused that (``publisher_answer``); RED goes on to subscribers that take it, its primary
alone to others (``subscriber_offer``, ``red``); its receiver reports tell a publisher of the
packets lost on the way in. Unlike LiveKit it sends no NACK and answers none, so a lost
packet of a track that refused RED stays lost. Data packets are relayed between
participants over SCTP data channels. In a test, ``LoopbackLiveKitServer`` runs it on a
thread and event loop of its own; ``python -m devtools.livekit_server`` runs it as a process.
"""

from .server_thread import LoopbackLiveKitServer

__all__ = ["LoopbackLiveKitServer"]
