"""The client side of the input path to a remote server.

``InputEncoder`` turns the transport's appends (its own format and rate) into
appends in the server's format and rate, cut into whole model units.
``OutgoingQueue`` holds messages for the socket; it never grows without bound:
beyond ``max_audio_ms`` of queued input audio the oldest audio is dropped.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

import numpy as np

from duplex_agent.agent.protocol.audio import (
    StreamingResampler,
    encode_base64_f32,
    encode_base64_pcm16,
)
from duplex_agent.agent.remote.outbox import Outgoing
from duplex_agent.agent.remote.session import RemoteSession

_ENCODERS = {"pcm16": encode_base64_pcm16, "pcm_f32le": encode_base64_f32}


class InputEncoder:
    """Transport audio -> server appends of whole units (or equal slices of a long unit)."""

    def __init__(self, remote: RemoteSession, *, max_append_ms: float = 100.0) -> None:
        self.out_rate = remote.input_rate
        self._encode = _ENCODERS[remote.input_format]
        unit = remote.capabilities.unit_samples
        unit_ms = 1000.0 * unit / self.out_rate
        # A 1 s unit (MiniCPM-o) would hold audio back for a second: send it in equal slices instead.
        self.append_samples = unit if unit_ms <= max_append_ms else unit // math.ceil(unit_ms / max_append_ms)
        self.in_format = "pcm16"
        self._resampler = StreamingResampler(self.out_rate, self.out_rate)
        self._pending: list[np.ndarray] = []
        self._pending_samples = 0

    @property
    def in_rate(self) -> int:
        return self._resampler.in_rate

    def configure(self, audio_format: str, rate: int) -> None:
        """The transport's declared input format (for the record: appends arrive as float32) and rate."""
        self.in_format = audio_format
        if rate != self._resampler.in_rate:
            self._resampler = StreamingResampler(rate, self.out_rate)

    def push(self, audio: np.ndarray) -> list[tuple[str, float]]:
        """Base64 server-format appends (with their ms) ready to go, from float32 transport audio."""
        samples = self._resampler.process(audio)
        if samples.size:
            self._pending.append(samples)
            self._pending_samples += samples.size
        if self._pending_samples < self.append_samples:
            return []
        audio = np.concatenate(self._pending)
        whole = audio.size - audio.size % self.append_samples
        rest = audio[whole:]
        self._pending = [rest] if rest.size else []
        self._pending_samples = rest.size
        return [self._packet(audio[i:i + self.append_samples]) for i in range(0, whole, self.append_samples)]

    def flush(self) -> list[tuple[str, float]]:
        """What is left (less than one append), before a commit."""
        if not self._pending_samples:
            return []
        audio = np.concatenate(self._pending)
        self.clear()
        return [self._packet(audio)]

    def clear(self) -> None:
        self._pending = []
        self._pending_samples = 0

    def _packet(self, samples: np.ndarray) -> tuple[str, float]:
        return self._encode(samples), 1000.0 * samples.size / self.out_rate


class OutgoingQueue:
    """Messages waiting for the socket, in order; input audio beyond ``max_audio_ms`` is dropped oldest first."""

    def __init__(self, max_audio_ms: float) -> None:
        self.max_audio_ms = max_audio_ms
        self._items: deque[Outgoing] = deque()
        self._audio_ms = 0.0
        self._nonempty = asyncio.Event()
        self._overflowing = False
        self.dropped_ms = 0.0

    @property
    def audio_ms(self) -> float:
        return self._audio_ms

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Outgoing) -> bool:
        """Queue ``item``; True when this starts an overflow (first audio dropped since the queue last held none)."""
        self._items.append(item)
        self._audio_ms += item.audio_ms
        self._nonempty.set()
        started = False
        while self._audio_ms > self.max_audio_ms:
            oldest = next(i for i, queued in enumerate(self._items) if queued.audio_ms > 0)
            dropped = self._items[oldest]
            del self._items[oldest]
            self._audio_ms -= dropped.audio_ms
            self.dropped_ms += dropped.audio_ms
            started = started or not self._overflowing
            self._overflowing = True
        return started

    def put_front(self, item: Outgoing) -> None:
        """Put back a message whose send failed; it goes first after a reconnect."""
        self._items.appendleft(item)
        self._audio_ms += item.audio_ms
        self._nonempty.set()

    async def get(self) -> Outgoing:
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        item = self._items.popleft()
        self._audio_ms -= item.audio_ms
        if self._audio_ms <= 0:
            self._overflowing = False
        return item

