"""One phone call as LiveKit's SIP bridge puts it in a room: a SIP-kind participant.

Like livekit-sip, the call joins the room as a client (the real livekit SDK here) before it
dials, with LiveKit's ``sip.*`` attributes and ``sip.callStatus`` going ``dialing``,
``ringing``, ``automation`` (the DTMF dialled after the answer), ``active`` and ``hangup``.
Its microphone track carries what the phone says through a phone line (``phone_line``), and
line noise or silence between; every 20 ms is sent, as a phone line sends RTP throughout.
What the room's other participants say comes back down the line and is kept at 8 kHz, as
the phone heard it. DTMF from the room (``publish_dtmf``) is kept as the phone's keypad
events; keys the phone presses go to the room as LiveKit's SIP DTMF packets.

Everything here runs on the SIP bridge's loop (``bridge.SipBridge``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from livekit import rtc

from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

from .phone_line import LINE_RATE, LineDirection
from .phones import Phone

log = logging.getLogger(__name__)

ROOM_RATE = 48000
FRAME = ROOM_RATE // 50  # 20 ms
#: The RFC 4733 event code of each key, as LiveKit's SIP DTMF packets carry it.
DTMF_CODES = {**{str(d): d for d in range(10)}, "*": 10, "#": 11, "A": 12, "B": 13, "C": 14, "D": 15}
#: A key press on the line: the tone, then the gap before the next (RFC 4733 events are
#: commonly 100 ms or more of tone with a gap of at least 40 ms).
KEY_PRESS_S = 0.1
KEY_GAP_S = 0.1
#: What ``w`` in a dialled DTMF string waits, as LiveKit's bridge does.
DIAL_WAIT_S = 0.5


@dataclass
class Heard:
    """A stretch of audio that crossed the line: when it was read (monotonic s), 8 kHz samples."""

    at: float
    samples: np.ndarray


@dataclass
class KeyEvent:
    at: float
    digit: str
    source: str  # "room": publish_dtmf from a participant; "dial": the request's dtmf after the answer


@dataclass
class CallRecord:
    """What a test reads of a call (a snapshot is taken on the bridge's loop)."""

    call_id: str
    number: str
    room: str
    identity: str
    status: str = "dialing"  # dialing | ringing | automation | active | hangup | failed
    sip_status: int = 0  # the final SIP status: 200 answered, else the refusal
    answered_at: float | None = None
    ended_at: float | None = None
    ended_by: str = ""  # phone | room (removed, room deleted) | transfer | max_duration | failed
    transferred_to: str = ""
    keys: list[KeyEvent] = field(default_factory=list)
    heard: list[Heard] = field(default_factory=list)
    said: list[Heard] = field(default_factory=list)

    def heard_audio(self, since: float = 0.0, until: float | None = None) -> np.ndarray:
        """What the phone heard (8 kHz) from ``since`` (monotonic s) on, to ``until`` when given."""
        parts = [h.samples for h in self.heard if h.at >= since and (until is None or h.at <= until)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    @property
    def rate(self) -> int:
        return LINE_RATE


class FarEndCall:
    """The room side of one phone call; its methods run on the bridge's loop."""

    def __init__(self, record: CallRecord, phone: Phone | None, url: str, token: str) -> None:
        self.record = record
        self.phone = phone
        self._url = url
        self._token = token
        self.room: rtc.Room | None = None  # made on the bridge's loop, which its events go to
        self._source: AgentVoiceSource | None = None
        self._up = LineDirection(ROOM_RATE, ROOM_RATE)
        self._speech: deque[np.ndarray] = deque()
        self._tasks: list[asyncio.Task] = []
        self._noise = np.random.default_rng(abs(hash(record.call_id)) % (2**32))
        self.ended = asyncio.Event()

    # ---- joining and leaving ----

    async def join(self) -> None:
        self.room = room = rtc.Room()
        room.on("track_subscribed", self._on_track)
        room.on("sip_dtmf_received", self._on_dtmf)
        room.on("disconnected", self._on_disconnected)
        await asyncio.wait_for(room.connect(self._url, self._token), 20)
        FfiRouter.shared().own_room(room)
        self._source = AgentVoiceSource(ROOM_RATE, 1, queue_size_ms=60)
        track = rtc.LocalAudioTrack.create_audio_track("phone", self._source.source)
        await room.local_participant.publish_track(
            track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE, dtx=False))
        self._tasks.append(asyncio.create_task(self._send_line(), name="sip-far-end-line"))

    def _connected(self) -> rtc.Room | None:
        return self.room if self.room is not None and self.room.isconnected() else None

    async def set_status(self, status: str) -> None:
        self.record.status = status
        room = self._connected()
        if room is not None:
            await room.local_participant.set_attributes({"sip.callStatus": status})

    async def end(self, by: str, *, status: str = "hangup") -> None:
        """The call ends (``by`` says who ended it): LiveKit's bridge sets ``hangup`` and leaves."""
        if self.record.ended_at is not None:
            return
        self.record.ended_at = time.monotonic()
        self.record.ended_by = by
        if status == "hangup" and self._connected() is not None:
            with contextlib.suppress(Exception):
                await self.set_status("hangup")
        self.record.status = status
        await self._leave()

    async def _leave(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        room = self._connected()
        if room is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(room.disconnect(), 10)
        if self._source is not None:
            await self._source.aclose()
            self._source = None
        self.ended.set()

    def _on_disconnected(self, reason: object) -> None:
        if self.record.ended_at is None:  # removed from the room, or the room was deleted: LiveKit sends BYE
            self.record.ended_at = time.monotonic()
            self.record.ended_by = "room"
            self.record.status = "hangup"
            asyncio.ensure_future(self._leave())

    # ---- what the phone says ----

    def say(self, audio: np.ndarray) -> None:
        """Queue 48 kHz audio for the phone to say, after what it is saying now."""
        self._speech.append(np.asarray(audio, np.float32))

    @property
    def speaking(self) -> bool:
        return bool(self._speech)

    def _next_frame(self) -> np.ndarray:
        frame = np.zeros(FRAME, np.float32)
        filled = 0
        while filled < FRAME and self._speech:
            head = self._speech[0]
            take = min(FRAME - filled, head.size)
            frame[filled:filled + take] = head[:take]
            filled += take
            if take == head.size:
                self._speech.popleft()
            else:
                self._speech[0] = head[take:]
        if self.phone is not None and self.phone.noise_dbfs is not None:
            frame += (10 ** (self.phone.noise_dbfs / 20) * self._noise.standard_normal(FRAME)).astype(np.float32)
        return frame

    async def _send_line(self) -> None:
        assert self._source is not None
        while True:
            out, line = self._up.carry(self._next_frame())
            if self.record.answered_at is not None:
                self.record.said.append(Heard(time.monotonic(), line))
            if out.size:
                pcm = (np.clip(out, -1, 1) * 32767).astype(np.int16)
                await self._source.capture_frame(rtc.AudioFrame(pcm.tobytes(), ROOM_RATE, 1, pcm.size))

    # ---- what the phone hears ----

    def _on_track(self, track: rtc.Track, publication: rtc.RemoteTrackPublication,
                  participant: rtc.RemoteParticipant) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO:
            self._tasks.append(asyncio.create_task(self._hear(track), name="sip-far-end-hear"))

    async def _hear(self, track: rtc.Track) -> None:
        down = LineDirection(ROOM_RATE, LINE_RATE)
        stream = CallerAudioStream(track, ROOM_RATE, frame_size_ms=20)
        try:
            async for frame in stream:
                samples = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768
                out, _ = down.carry(samples)
                if self.record.answered_at is not None and out.size:
                    self.record.heard.append(Heard(time.monotonic(), out))
        finally:
            await stream.aclose()

    # ---- keys ----

    def _on_dtmf(self, dtmf: rtc.SipDTMF) -> None:
        self.record.keys.append(KeyEvent(time.monotonic(), dtmf.digit, "room"))

    async def dial_keys(self, digits: str) -> None:
        """The request's ``dtmf``, played down the line once the phone answered (``w``: wait)."""
        for digit in digits:
            if digit == "w":
                await asyncio.sleep(DIAL_WAIT_S)
                continue
            self.record.keys.append(KeyEvent(time.monotonic(), digit, "dial"))
            await asyncio.sleep(KEY_PRESS_S + KEY_GAP_S)

    async def press(self, digits: str) -> None:
        """The phone's keypad: each key goes to the room as LiveKit's SIP DTMF packet, paced as on the line."""
        for digit in digits:
            room = self._connected()
            if room is None:
                return
            await room.local_participant.publish_dtmf(code=DTMF_CODES[digit], digit=digit)
            await asyncio.sleep(KEY_PRESS_S + KEY_GAP_S)
