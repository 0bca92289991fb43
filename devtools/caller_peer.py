"""A caller's side of a direct WebRTC call (aiortc), for the benches' and devtools' callers.

``Mic`` says one clip at a time and notes when its speech went out; ``CallerPeer`` is the peer
connection with the worker's ``events`` data channel, the agent's frames and events as they
arrive, and a wait on them. How a caller offers, and what it says when, is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from duplex_agent.webrtc.direct.tracks import frame_to_mono_f32

FRAME = 960  # 20 ms at 48 kHz
LOUD_RMS = 0.02  # a received frame of the agent's speech
SPEECH_LEVEL = 0.01  # a sample of the caller's own speech


class Mic:
    """The caller's microphone: one clip at a time (``say`` replaces the one playing), then silence;
    notes when the clip's first loud frame and last speech frame were handed to the sender."""

    def __init__(self) -> None:
        self._pcm = np.zeros(0, np.int16)
        self._position = 0
        self._first = self._last = -1
        self.first_loud_sent_at: float | None = None
        self.last_speech_sent_at: float | None = None

    def say(self, audio: np.ndarray) -> None:
        loud = np.flatnonzero(np.abs(audio) > SPEECH_LEVEL)
        self._first, self._last = (int(loud[0]) // FRAME, int(loud[-1]) // FRAME) if loud.size else (-1, -1)
        self._pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
        self._position = 0
        self.first_loud_sent_at = self.last_speech_sent_at = None

    @property
    def busy(self) -> bool:
        return self._position < self._pcm.size

    def next_frame(self) -> np.ndarray:
        frame = np.zeros(FRAME, np.int16)
        chunk = self._pcm[self._position : self._position + FRAME]
        frame[: chunk.size] = chunk
        if chunk.size:
            index = self._position // FRAME
            if index == self._first:
                self.first_loud_sent_at = time.perf_counter()
            if index == self._last:
                self.last_speech_sent_at = time.perf_counter()
        self._position += FRAME
        return frame


class CallerPeer:
    """One aiortc peer connection to the worker: ``track`` sent, the ``events`` data channel, the
    agent's audio heard (its loud frames' times, the current quiet run; each frame also handed to
    ``on_frame``), the worker's events with their arrival times."""

    def __init__(self, track: MediaStreamTrack, on_frame: Callable[[np.ndarray], None] | None = None) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("events")
        self.sender = self.pc.addTrack(track)
        self._on_frame = on_frame
        self.pc.on("track", self._on_track)
        self.channel.on("message", self._on_message)
        self.channel.on("open", self._changed)
        self.pc.on("connectionstatechange", self._changed)
        self.frames_heard = 0
        self.quiet_run = 0  # frames heard in a row that were not loud
        self.loud_at: list[float] = []
        self.events: list[tuple[float, dict]] = []
        self._change = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []  # the track readers, and what a caller adds; cancelled at close

    def _changed(self) -> None:
        self._change.set()

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            return
        if isinstance(event, dict):
            self.events.append((time.perf_counter(), event))
            self._change.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        async def read() -> None:
            try:
                while True:
                    samples = frame_to_mono_f32(await track.recv())
                    self.frames_heard += 1
                    self.quiet_run += 1
                    if float(np.sqrt(np.mean(samples ** 2))) > LOUD_RMS:
                        self.loud_at.append(time.perf_counter())
                        self.quiet_run = 0
                    if self._on_frame is not None:
                        self._on_frame(samples)
                    self._change.set()
            except MediaStreamError:  # the track ended with the call
                pass

        self.tasks.append(asyncio.create_task(read()))

    def send(self, message: dict) -> None:
        self.channel.send(json.dumps(message))

    def events_since(self, mark: int, kind: str) -> list[dict]:
        return [e for _, e in self.events[mark:] if e.get("type") == kind]

    async def until(self, condition: Callable[[], object], timeout: float) -> bool:
        """Wait on the call's own signals (frames, events, state) until ``condition()`` holds."""
        deadline = time.perf_counter() + timeout
        while not condition():
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self._change.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._change.wait(), min(left, 0.05))
        return True

    async def close(self) -> None:
        await self.pc.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
