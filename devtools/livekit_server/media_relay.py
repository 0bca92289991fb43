"""aiortc helpers: peer connections, trickle parsing, SDP inspection, track fan-out."""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
from typing import Iterable

import av
from aiortc import RTCConfiguration, RTCIceCandidate, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.sdp import candidate_from_sdp

from duplex_agent.webrtc.direct.tracks import opus_voice_encoder

log = logging.getLogger(__name__)

RELIABLE_LABEL = "_reliable"
#: Bits per second of relayed audio (mono Opus): well above a voice's needs.
RELAY_BITRATE = 64000
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
    """Reads a remote track continuously and copies frames to subscriber queues."""

    def __init__(self, source: MediaStreamTrack, queue_size: int = 50) -> None:
        self.source = source
        self.kind = source.kind
        self._queue_size = queue_size
        self._subs: set[RelayedTrack] = set()
        self._task: asyncio.Task | None = None
        self.frames = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name="lk-track-fanout")

    async def _pump(self) -> None:
        try:
            while True:
                frame = await self.source.recv()
                self.frames += 1
                for sub in list(self._subs):
                    sub._push(frame)
        except (MediaStreamError, asyncio.CancelledError):
            pass
        except Exception:  # decoder errors etc.
            log.exception("track fanout failed")
        finally:
            for sub in list(self._subs):
                sub._push(None)

    def subscribe(self, track_sid: str) -> "RelayedTrack":
        t = RelayedTrack(self, track_sid, self._queue_size)
        self._subs.add(t)
        return t

    def _unsubscribe(self, t: "RelayedTrack") -> None:
        self._subs.discard(t)

    async def stop(self) -> None:
        for sub in list(self._subs):
            sub.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class RelayedTrack(MediaStreamTrack):
    """Outgoing track for one subscriber; its id is the LiveKit track sid.

    Audio goes out as Opus this track encodes itself, on the loop, mono: aiortc's sender
    would hop to a thread per frame, encode stereo at 96 kb/s and compute an RTP audio level
    in Python, which made this test server, running inside the test process, starve its own
    media with four calls. A real SFU forwards the publisher's packets untouched, so this
    re-encode keeps a high bitrate and full complexity, to take as little from the audio as
    it can (tests transcribe what callers hear).
    """

    def __init__(self, fanout: TrackFanout, track_sid: str, queue_size: int) -> None:
        super().__init__()
        self.kind = fanout.kind
        self._id = track_sid  # aiortc puts track.id into the msid line
        self._fanout = fanout
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=queue_size)
        self._opus = _MonoOpus() if self.kind == "audio" else None

    def _push(self, frame) -> None:
        if self._queue.full():  # keep real time: drop the oldest frame
            try:
                self._queue.get_nowait()
            except asyncio.QueueEmpty:
                pass
        self._queue.put_nowait(frame)

    async def recv(self):
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            frame = await self._queue.get()
            if frame is None:
                self.stop()
                raise MediaStreamError
            if self._opus is None:
                return frame
            packet = self._opus.encode(frame)
            if packet is not None:
                return packet

    def stop(self) -> None:
        self._fanout._unsubscribe(self)
        if self._queue.empty():
            self._queue.put_nowait(None)
        super().stop()


class _MonoOpus:
    """Decoded audio frames in (any channel count, 10 or 20 ms), one 20 ms mono Opus packet out per 20 ms."""

    RATE = 48000
    FRAME = 960

    def __init__(self) -> None:
        self._encoder = opus_voice_encoder(RELAY_BITRATE, complexity=10)
        self._fifo = av.AudioFifo()
        self._time_base = fractions.Fraction(1, self.RATE)
        self._pts = 0

    def encode(self, frame: av.AudioFrame) -> av.Packet | None:
        data = frame.to_ndarray()
        channels = len(frame.layout.channels)
        mono = data[:1] if frame.format.is_planar else data.reshape(1, -1)[:, ::channels]
        if frame.sample_rate != self.RATE or mono.dtype.name != "int16":
            return None  # aiortc's Opus decoder gives 48 kHz s16; nothing else reaches a relay
        piece = av.AudioFrame.from_ndarray(mono.copy(), format="s16", layout="mono")
        piece.sample_rate = self.RATE
        piece.pts = None
        self._fifo.write(piece)
        whole = self._fifo.read(self.FRAME)
        if whole is None:
            return None
        whole.pts = self._pts
        packets = self._encoder.encode(whole)
        if not packets:
            return None
        packet = packets[0]
        packet.pts = self._pts
        packet.time_base = self._time_base
        self._pts += self.FRAME
        return packet
