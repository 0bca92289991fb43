"""Every use of aiortc internals by the loopback SFU, in one place.

Checked against aiortc 1.16.0 (rtcrtpreceiver.py, rtcrtpsender.py, rtcdtlstransport.py).
The SFU forwards audio RTP as it arrives, as LiveKit's does, so it steps around two of
aiortc's stages:

- the receiver: ``RTCDtlsTransport`` awaits ``receiver._handle_rtp_packet(packet, ...)``
  for each SRTP packet it has unprotected; that method feeds the JitterBuffer
  (capacity 16, prefetch 4: a packet leaves only once 4 newer have come) and the
  decoder. ``tap_rtp`` puts a handler in its place, so packets leave on arrival and
  nothing is decoded, and registers the RED payload type the server's answer chose. It
  still counts each packet that arrived into the statistics the receiver's RTCP receiver
  reports are built from, so the publisher hears of loss on its uplink, as from LiveKit;
- the sender: its RTP task takes frames or packets from a track and numbers them
  itself, which would hide a lost packet and add a hop through the loop.
  ``RtpWriter`` writes the publisher's packets straight onto the subscriber's SRTP
  transport (``RTCDtlsTransport._send_rtp``, which never suspends), with the sender's
  SSRC, its negotiated Opus payload type (or the RED one the subscriber took) and header
  extensions, and keeps the counters its RTCP sender reports are built from;
- the msid: aiortc writes each sender's ``_stream_id`` (a random one) into its
  ``a=msid`` line and has no setting for it; ``set_msid_stream`` sets the one the
  SDK reads;
- the start of a negotiated section: aiortc starts a section's sender and receiver in the
  connect step each negotiation schedules (``RTCPeerConnection.__connect``), and only if
  the DTLS transport is connected when that step looks; a step that finds the handshake
  under way skips them, and the step that is driving the handshake may already have
  passed them. A section negotiated during the handshake (which a lossy link stretches
  to seconds) then never sends or receives. ``start_sections_once_connected`` runs the
  connect step again once the connection is up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable

from aiortc import RTCPeerConnection, RTCRtpCodecParameters, RTCRtpReceiver, RTCRtpSender, clock
from aiortc.rtcrtpparameters import RTCRtpReceiveParameters
from aiortc.rtcrtpreceiver import StreamStatistics
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

RtpHandler = Callable[[RtpPacket], Awaitable[bool]]  # False: the packet counts as lost


def tap_rtp(receiver: RTCRtpReceiver, handler: RtpHandler, red_payload_type: int | None = None) -> None:
    """Route every Opus RTP packet of ``receiver`` to ``handler`` instead of its jitter buffer
    and decoder (whose thread still starts and idles until the receiver stops); RED ones too
    under ``red_payload_type``, which the transport would otherwise drop as a type aiortc did
    not negotiate (it knows no RED)."""
    codecs: dict[int, str] = {}
    receive = receiver.receive

    async def _receive(parameters: RTCRtpReceiveParameters) -> None:
        if red_payload_type is not None:  # a copy: ``codecs`` is the transceiver's own list
            red = RTCRtpCodecParameters(mimeType="audio/red", clockRate=48000, channels=2,
                                        payloadType=red_payload_type)
            parameters = dataclasses.replace(parameters, codecs=[*parameters.codecs, red])
        codecs.update({c.payloadType: c.mimeType.lower() for c in parameters.codecs})
        await receive(parameters)

    async def _handle_rtp_packet(packet: RtpPacket, arrival_time_ms: int) -> None:
        if receiver._enabled and codecs.get(packet.payload_type) in ("audio/opus", "audio/red") \
                and await handler(packet):
            reported = receiver._RTCRtpReceiver__remote_streams  # type: ignore[attr-defined]
            reported.setdefault(packet.ssrc, StreamStatistics(48000)).add(packet)

    receiver.receive = _receive  # type: ignore[method-assign]
    receiver._handle_rtp_packet = _handle_rtp_packet  # type: ignore[method-assign]


def start_sections_once_connected(pc: RTCPeerConnection) -> None:
    """Once ``pc`` connects, start every negotiated section that aiortc's own connect steps
    skipped, as pion (LiveKit's) does: a sender bound at negotiation sends as soon as the
    transport is up, whichever came first. The step starts only what has not started (a
    sender's ``send`` and a receiver's ``receive`` do nothing the second time)."""

    @pc.on("connectionstatechange")
    async def _on_state() -> None:
        if pc.connectionState == "connected":
            await pc._RTCPeerConnection__connect()  # type: ignore[attr-defined]


def set_msid_stream(sender: RTCRtpSender, stream_id: str) -> None:
    """The stream id of ``sender``'s ``a=msid`` line (set before the offer is made)."""
    sender._stream_id = stream_id  # type: ignore[attr-defined]


class RtpWriter:
    """Sends RTP on a subscriber's sender once aiortc has started it (negotiated)."""

    def __init__(self, sender: RTCRtpSender) -> None:
        self._sender = sender
        self.payload_type: int | None = None  # Opus, as negotiated
        self.red_payload_type: int | None = None  # RED, when the subscriber's answer took it
        self._mid: str | None = None
        self._extensions = HeaderExtensionsMap()
        send = sender.send

        async def _send(parameters) -> None:
            self.payload_type = parameters.codecs[0].payloadType
            self._mid = parameters.muxId
            self._extensions.configure(parameters)
            await send(parameters)

        sender.send = _send  # type: ignore[method-assign]

    @property
    def ready(self) -> bool:
        return self.payload_type is not None and self._sender.transport.state == "connected"

    @property
    def waiting_for(self) -> str:
        """What keeps it from sending: the subscriber's answer, or its transport's connection."""
        if self.payload_type is None:
            return "its sender to start (an answer applied on a connected transport)"
        return f"transport {self._sender.transport.state}"

    async def write(self, source: RtpPacket, sequence_number: int, timestamp: int,
                    payload_type: int, payload: bytes) -> int:
        """Sends ``payload`` as ``source`` renumbered; returns when it was handed to the SRTP
        transport (perf_counter_ns), which stamp leaves out the GIL waits of SRTP and sendto,
        whose C calls release it."""
        packet = RtpPacket(payload_type=payload_type, marker=source.marker,
                           sequence_number=sequence_number, timestamp=timestamp,
                           ssrc=self._sender._ssrc, payload=payload)
        packet.extensions.mid = self._mid
        packet.extensions.abs_send_time = (clock.current_ntp_time() >> 14) & 0x00FFFFFF
        packet.extensions.audio_level = source.extensions.audio_level
        data = packet.serialize(self._extensions)
        handed_ns = time.perf_counter_ns()
        await self._sender.transport._send_rtp(data)
        # what the sender's RTCP sender report reads (its own RTP task sends nothing)
        s = self._sender
        s._RTCRtpSender__ntp_timestamp = clock.current_ntp_time()  # type: ignore[attr-defined]
        s._RTCRtpSender__rtp_timestamp = timestamp  # type: ignore[attr-defined]
        s._RTCRtpSender__octet_count += len(payload)  # type: ignore[attr-defined]
        s._RTCRtpSender__packet_count += 1  # type: ignore[attr-defined]
        return handed_ns
