"""aiortc helpers: peer connections, trickle parsing, SDP inspection, track fan-out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from aiortc import RTCConfiguration, RTCIceCandidate, RTCPeerConnection, RTCRtpReceiver, RTCRtpTransceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket
from aiortc.sdp import candidate_from_sdp

from . import red
from .aiortc_seams import RtpWriter, tap_rtp

log = logging.getLogger(__name__)

RELIABLE_LABEL = "_reliable"
LOSSY_LABEL = "_lossy"
#: Packets held from one subscriber before the server says so in its log: about 5 s of audio.
HELD_WARNING = 250


def new_peer_connection() -> RTCPeerConnection:
    # iceServers=[]: no STUN/TURN, so nothing leaves this machine (aiortc's default is Google STUN)
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


def parse_trickle(candidate_init: str, allowed_ips: Iterable[str]) -> RTCIceCandidate | None:
    """Decode the SDK's JSON candidate; only UDP candidates on allowed addresses are kept."""
    try:
        obj = json.loads(candidate_init)
    except ValueError:
        return None
    cand = obj.get("candidate") or ""
    if cand.startswith("candidate:"):
        cand = cand[len("candidate:") :]
    if not cand:
        return None
    try:
        c = candidate_from_sdp(cand)
    except (AssertionError, ValueError, IndexError):
        return None
    if c.protocol.lower() != "udp" or c.ip not in set(allowed_ips):
        return None
    c.sdpMid = obj.get("sdpMid")
    c.sdpMLineIndex = obj.get("sdpMLineIndex")
    return c


def media_sections(sdp: str) -> list[dict]:
    """Minimal m-section parse: kind, mid, direction, msid track id."""
    out: list[dict] = []
    cur: dict | None = None
    for raw in sdp.splitlines():
        line = raw.strip()
        if line.startswith("m="):
            cur = {"kind": line[2:].split(" ", 1)[0], "mid": None, "direction": "sendrecv",
                   "track_id": None, "port": line.split(" ")[1] if " " in line else ""}
            out.append(cur)
        elif cur is None:
            continue
        elif line.startswith("a=mid:"):
            cur["mid"] = line[6:]
        elif line in ("a=sendrecv", "a=sendonly", "a=recvonly", "a=inactive"):
            cur["direction"] = line[2:]
        elif line.startswith("a=msid:"):
            parts = line[7:].split()
            if len(parts) >= 2:
                cur["track_id"] = parts[1]
    return out


class Hop(NamedTuple):
    """One audio packet's pass through the server to one subscriber (perf_counter_ns)."""

    track_sid: str
    subscriber: str
    sequence_number: int  # the publisher's
    arrived_ns: int  # handed to the server by the publisher's SRTP transport
    sent_ns: int  # rewritten and handed to the subscriber's SRTP transport


class Arrival(NamedTuple):
    track_sid: str
    sequence_number: int
    arrived_ns: int
    lost: bool  # dropped on arrival by ``AudioForwarder.lose`` (fault tests)
    red: bool  # sent as RED by the publisher


class ForwardingRecord:
    """The server's own per-packet record of what it forwarded, newest kept."""

    def __init__(self, maxlen: int = 50_000) -> None:
        self.hops: deque[Hop] = deque(maxlen=maxlen)
        self.arrivals: deque[Arrival] = deque(maxlen=maxlen)
        self.publishers: dict[str, str] = {}  # audio track sid -> "room/identity" that published it
        self.forwarders: dict[str, AudioForwarder] = {}  # audio track sid -> its forwarder

    def summary(self, now_ns: int) -> list[str]:
        """Per audio track: packets in and out to each subscriber, and how long ago the last one
        went (for a failure's reader: where a caller's audio stopped, before the server or after)."""
        lines = []
        for sid, publisher in self.publishers.items():
            arrived = [a.arrived_ns for a in self.arrivals if a.track_sid == sid]
            line = f"{sid} from {publisher}: {len(arrived)} packets in" + _last(arrived, now_ns)
            subscribers: dict[str, list[int]] = {}
            for hop in self.hops:
                if hop.track_sid == sid:
                    subscribers.setdefault(hop.subscriber, []).append(hop.sent_ns)
            forwarder = self.forwarders.get(sid)
            unready = [] if forwarder is None else forwarder.unready_subscribers()
            starts = {} if forwarder is None else forwarder.starts()
            lines.append(line + "".join(f"; {len(sent)} to {who}" + _last(sent, now_ns) + starts.get(who, "")
                                        for who, sent in subscribers.items())
                         + "".join(f"; {held} held from {who} ({why})" for who, held, why in unready))
        return lines


def _last(stamps: list[int], now_ns: int) -> str:
    return f", the last {(now_ns - stamps[-1]) / 1e9:.2f} s ago" if stamps else ""


class AudioForwarder:
    """A published audio track's packets, sent on to each subscriber as they arrive, as
    LiveKit's SFU does: no jitter buffer, no decode, no hold. A packet lost on the way in
    is simply not forwarded; the subscriber sees the gap in sequence numbers. A track the
    publisher sends as RED (``red_payload_type``, as the server's answer chose) goes on as
    RED to a subscriber that took RED, and as its Opus frames alone to one that did not."""

    kind = "audio"

    def __init__(self, receiver: RTCRtpReceiver, track_sid: str, record: ForwardingRecord,
                 red_payload_type: int | None = None) -> None:
        self.track_sid = track_sid
        self.red_payload_type = red_payload_type
        self._record = record
        self._subs: set[ForwardedAudioTrack] = set()
        self._to_lose = 0
        record.forwarders[track_sid] = self
        tap_rtp(receiver, self._on_rtp, red_payload_type)

    def lose(self, count: int) -> None:
        """Drop the next ``count`` packets on arrival, as loss on the publisher's uplink."""
        self._to_lose += count

    async def _on_rtp(self, packet: RtpPacket) -> bool:
        """Forwards ``packet``; False if it was lost on the way in."""
        arrived = time.perf_counter_ns()
        lost = self._to_lose > 0
        self._record.arrivals.append(Arrival(self.track_sid, packet.sequence_number, arrived, lost,
                                             packet.payload_type == self.red_payload_type))
        if lost:
            self._to_lose -= 1
            return False
        for sub in list(self._subs):
            if not sub.writer.ready:
                sub.held += 1
                if sub.held == HELD_WARNING:
                    log.warning("%s: %d packets held from %s, its writer waiting for %s", self.track_sid,
                                sub.held, sub.subscriber, sub.writer.waiting_for)
                continue
            try:
                sent = await sub.forward(packet)
            except ConnectionError:  # that subscriber's transport is going away
                continue
            except Exception:  # raised here it would end the publisher's receive loop
                log.exception("forwarding to %s failed", sub.subscriber)
                continue
            if sent is None:
                continue
            if sub.first_sent_ns is None:
                sub.first_sent_ns = sent
            self._record.hops.append(Hop(self.track_sid, sub.subscriber, packet.sequence_number,
                                         arrived, sent))
        return True

    def attach(self, pc: RTCPeerConnection, subscriber: str, transceiver: RTCRtpTransceiver | None = None):
        """A sendonly transceiver on ``pc`` carrying this track (``transceiver``, one the
        subscriber offered to receive on, or a new one); returns (track, transceiver)."""
        track = ForwardedAudioTrack(self, subscriber)
        transceiver = _sending(pc, track, transceiver)
        track.writer = RtpWriter(transceiver.sender)
        self._subs.add(track)
        return track, transceiver

    def _detach(self, track: ForwardedAudioTrack) -> None:
        self._subs.discard(track)

    def starts(self) -> dict[str, str]:
        """Per attached subscriber: how many packets were held from it before its first went, and
        how long after it subscribed that first one went (for a failure's reader)."""
        out = {}
        for sub in self._subs:
            first = "" if sub.first_sent_ns is None else f", first {(sub.first_sent_ns - sub.attached_ns) / 1e9:.2f} s after subscribing"
            out[sub.subscriber] = f" ({sub.held} held{first})"
        return out

    def unready_subscribers(self) -> list[tuple[str, int, str]]:
        """Each attached subscriber this track's packets are held from: who, how many packets,
        and what its writer waits for (for a failure's reader)."""
        return [(sub.subscriber, sub.held, sub.writer.waiting_for) for sub in self._subs if not sub.writer.ready]

    async def stop(self) -> None:
        for sub in list(self._subs):
            sub.stop()


class ForwardedAudioTrack(MediaStreamTrack):
    """One subscriber's copy of a forwarded audio track. Its id is the LiveKit track sid
    (aiortc puts it in the msid line). It yields nothing: aiortc's sender task idles on
    ``recv`` until it ends, and packets go out through ``writer`` instead. Sequence
    numbers and timestamps are the publisher's shifted by a random offset per
    subscriber, so gaps and pauses pass through as they came."""

    kind = "audio"

    def __init__(self, forwarder: AudioForwarder, subscriber: str) -> None:
        super().__init__()
        self._id = forwarder.track_sid
        self.subscriber = subscriber
        self.writer: RtpWriter  # set by AudioForwarder.attach
        self._forwarder = forwarder
        self._ended = asyncio.Event()
        self.held = 0  # packets not sent: the writer was not ready
        self.attached_ns = time.perf_counter_ns()
        self.first_sent_ns: int | None = None
        self._seq_offset = random.getrandbits(16)
        self._ts_offset = random.getrandbits(32)

    @property
    def offers_red(self) -> bool:
        """Whether the server offers this subscriber RED (the publisher sends it)."""
        return self._forwarder.red_payload_type is not None

    async def forward(self, packet: RtpPacket) -> int | None:
        """Sends ``packet`` on; when it was handed to the transport (perf_counter_ns), or None
        for a RED packet whose payload is not RED, which is dropped."""
        writer = self.writer
        payload_type, payload = writer.payload_type, packet.payload
        if packet.payload_type == self._forwarder.red_payload_type:
            if writer.red_payload_type is not None:  # RED as it came, its blocks in this subscriber's Opus type
                payload_type, payload = writer.red_payload_type, red.with_payload_type(payload, writer.payload_type)
            else:
                payload = red.primary(payload)
        if payload is None:
            return None
        return await writer.write(packet, (packet.sequence_number + self._seq_offset) & 0xFFFF,
                                  (packet.timestamp + self._ts_offset) & 0xFFFFFFFF, payload_type, payload)

    async def recv(self):
        await self._ended.wait()
        raise MediaStreamError

    def stop(self) -> None:
        self._forwarder._detach(self)
        self._ended.set()
        super().stop()


class TrackFanout:
    """Copies a published video track to its subscribers as decoded frames (no test
    publishes video; audio goes through ``AudioForwarder``)."""

    kind = "video"

    def __init__(self, source: MediaStreamTrack, track_sid: str, queue_size: int = 50) -> None:
        self.source = source
        self.track_sid = track_sid
        self._queue_size = queue_size
        self._subs: set[RelayedTrack] = set()
        self._task = asyncio.create_task(self._pump(), name="lk-track-fanout")

    def _forward(self, item) -> None:
        for sub in list(self._subs):
            sub._push(item)

    async def _pump(self) -> None:
        try:
            while True:
                self._forward(await self.source.recv())
        except (MediaStreamError, asyncio.CancelledError):
            pass
        except Exception:  # decoder errors etc.
            log.exception("track fanout failed")
        finally:
            self._forward(None)

    def attach(self, pc: RTCPeerConnection, subscriber: str, transceiver: RTCRtpTransceiver | None = None):
        track = RelayedTrack(self, self.track_sid, self._queue_size)
        self._subs.add(track)
        return track, _sending(pc, track, transceiver)

    def _unsubscribe(self, t: RelayedTrack) -> None:
        self._subs.discard(t)

    async def stop(self) -> None:
        for sub in list(self._subs):
            sub.stop()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class RelayedTrack(MediaStreamTrack):
    """Outgoing video track for one subscriber; its id is the LiveKit track sid."""

    kind = "video"

    def __init__(self, fanout: TrackFanout, track_sid: str, queue_size: int) -> None:
        super().__init__()
        self._id = track_sid  # aiortc puts track.id into the msid line
        self._fanout = fanout
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=queue_size)

    def _push(self, item) -> None:
        if self._queue.full():  # keep real time: drop the oldest
            with contextlib.suppress(asyncio.QueueEmpty):
                self._queue.get_nowait()
        self._queue.put_nowait(item)

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        item = await self._queue.get()
        if item is None:
            self.stop()
            raise MediaStreamError
        return item

    def stop(self) -> None:
        self._fanout._unsubscribe(self)
        if self._queue.empty():
            self._queue.put_nowait(None)
        super().stop()


def _sending(pc: RTCPeerConnection, track: MediaStreamTrack,
             transceiver: RTCRtpTransceiver | None) -> RTCRtpTransceiver:
    """``transceiver`` (not yet sending) now sending ``track``, or a new sendonly one on ``pc``."""
    if transceiver is None:
        return pc.addTransceiver(track, direction="sendonly")
    transceiver.sender.replaceTrack(track)
    transceiver.direction = "sendonly"
    return transceiver


def make_fanout(track: MediaStreamTrack, receiver: RTCRtpReceiver, track_sid: str,
                record: ForwardingRecord, publisher: str,
                red_payload_type: int | None = None) -> AudioForwarder | TrackFanout:
    """``publisher``: "room/identity", for the record's summary; ``red_payload_type``: the RED
    the server's answer put first for an audio track."""
    if track.kind == "audio":
        record.publishers[track_sid] = publisher
        return AudioForwarder(receiver, track_sid, record, red_payload_type)
    return TrackFanout(track, track_sid)
