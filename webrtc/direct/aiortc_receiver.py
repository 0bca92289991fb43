"""The one place that reaches into aiortc (RTCRtpReceiver's private members; the version checked is in
``webrtc.private_internals``).

aiortc's receiver parses RTP and RTCP, then hands each packet to its jitter buffer
(``__jitter_buffer.add(packet) -> (pli, frame)``) and each completed frame to its
decoder thread through ``__decoder_queue`` (``put``; ``put(None)`` when it stops).
The caller's reader (``caller_receive.AdaptiveCallerAudioReader``) takes both places before the
receiver starts: the packets come to it instead of aiortc's jitter buffer, and the receiver's
stop reaches it as ``put(None)``.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiortc import RTCRtpReceiver


class DecoderQueue(Protocol):
    def put(self, task: Any) -> None: ...
    def get(self) -> Any: ...


class PacketIntake(Protocol):
    def add(self, packet: Any) -> tuple[bool, None]: ...


def _check_not_started(receiver: RTCRtpReceiver) -> None:
    if getattr(receiver, "_RTCRtpReceiver__started", True):
        raise RuntimeError("the caller's receiver has started: its decoder queue can no longer be replaced")


def take_decoder_queue(receiver: RTCRtpReceiver, queue: DecoderQueue) -> None:
    """Frames (and the stop) go to ``queue`` instead of aiortc's decoder thread."""
    _check_not_started(receiver)
    receiver._RTCRtpReceiver__decoder_queue = queue  # type: ignore[attr-defined]


def take_packets(receiver: RTCRtpReceiver, intake: PacketIntake) -> None:
    """Each RTP packet (parsed, RTX unwrapped, a known payload type) goes to ``intake.add``
    instead of aiortc's jitter buffer; ``add`` returns ``(False, None)``: no PLI, no frame."""
    _check_not_started(receiver)
    receiver._RTCRtpReceiver__jitter_buffer = intake  # type: ignore[attr-defined]
