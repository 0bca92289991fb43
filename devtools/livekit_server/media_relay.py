"""aiortc helpers: peer connections, trickle parsing, SDP inspection, track fan-out."""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import threading
from typing import Iterable

import av
from aiortc import RTCConfiguration, RTCIceCandidate, RTCPeerConnection, RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.sdp import candidate_from_sdp

log = logging.getLogger(__name__)

RELIABLE_LABEL = "_reliable"
LOSSY_LABEL = "_lossy"


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


class TrackFanout:
    """Copies a published track to its subscribers.

    Audio is forwarded as the publisher's Opus packets, untouched, as LiveKit's SFU does:
    ``EncodedAudioTap`` takes them from the receiver before aiortc's decoder thread. No
    decode and no re-encode, so the test server costs little and takes nothing from what
    the callers hear. Video (no test publishes any) goes through decoded frames.
    """

    def __init__(self, source: MediaStreamTrack, receiver: RTCRtpReceiver | None = None,
                 queue_size: int = 50) -> None:
        self.source = source
        self.kind = source.kind
        self._queue_size = queue_size
        self._subs: set[RelayedTrack] = set()
        self._task: asyncio.Task | None = None
        self._tap = EncodedAudioTap(receiver, self._forward) if self.kind == "audio" and receiver is not None else None

    def start(self) -> None:
        if self._task is None and self._tap is None:
            self._task = asyncio.create_task(self._pump(), name="lk-track-fanout")

    def _forward(self, item: av.Packet | av.frame.Frame | None) -> None:
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

    def subscribe(self, track_sid: str) -> "RelayedTrack":
        t = RelayedTrack(self, track_sid, self._queue_size)
        self._subs.add(t)
        return t

    def _unsubscribe(self, t: "RelayedTrack") -> None:
        self._subs.discard(t)

    async def stop(self) -> None:
        for sub in list(self._subs):
            sub.stop()
        if self._tap is not None:
            self._tap.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class EncodedAudioTap:
    """Stands in for an aiortc receiver's decoder queue (set before the receiver starts):
    each complete encoded frame, on the loop, goes to ``forward`` as an ``av.Packet`` whose
    pts is its RTP timestamp; None when the receiver stops. aiortc's decoder thread still
    starts and waits in ``get`` until then."""

    def __init__(self, receiver: RTCRtpReceiver, forward) -> None:
        if getattr(receiver, "_RTCRtpReceiver__started", True):
            raise RuntimeError("the receiver has started: its decoder queue can no longer be replaced")
        self._forward = forward
        self._stopped = threading.Event()
        receiver._RTCRtpReceiver__decoder_queue = self  # type: ignore[attr-defined]

    def put(self, task) -> None:
        if task is None:
            self.close()
            return
        if self._stopped.is_set():
            return
        codec, encoded = task
        packet = av.Packet(encoded.data)
        packet.pts = encoded.timestamp
        packet.time_base = fractions.Fraction(1, codec.clockRate)
        self._forward(packet)

    def get(self) -> None:
        self._stopped.wait()
        return None

    def close(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._forward(None)


class RelayedTrack(MediaStreamTrack):
    """Outgoing track for one subscriber; its id is the LiveKit track sid. Audio comes as
    packets (aiortc's sender sends them as they are), video as frames."""

    def __init__(self, fanout: TrackFanout, track_sid: str, queue_size: int) -> None:
        super().__init__()
        self.kind = fanout.kind
        self._id = track_sid  # aiortc puts track.id into the msid line
        self._fanout = fanout
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=queue_size)

    def _push(self, item) -> None:
        if self._queue.full():  # keep real time: drop the oldest
            try:
                self._queue.get_nowait()
            except asyncio.QueueEmpty:
                pass
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
