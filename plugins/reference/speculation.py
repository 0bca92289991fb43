"""A turn's transcript built while the caller speaks: each piece of audio is transcribed once.

At every pause (SPECULATE_AFTER_QUIET_MS of quiet after speech) the audio since the
last settled piece is transcribed speculatively, so the words are ready when the turn
ends. If the caller goes on and that audio is at least SETTLE_AFTER_S long, its
transcription is kept as a settled piece of the turn and only newer audio is
transcribed from then on: a monologue costs about one pass over its audio, not one
pass per pause over everything so far. A shorter guess is dropped instead (Whisper
needs a few seconds of context; cutting a sentence into word-sized pieces loses words),
so its audio is transcribed again, at most a few seconds of it per piece. At most one
transcription per turn runs at a time; a pause that comes while one runs waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

SPECULATE_AFTER_QUIET_MS = 160
SETTLE_AFTER_S = 3.0
QUIET_RMS = 0.01

Transcribe = Callable[[np.ndarray], Awaitable[str]]


class SpeculativeTranscript:
    def __init__(self, transcribe: Transcribe, sample_rate: int) -> None:
        self._transcribe = transcribe
        self._rate = sample_rate
        self._settled: list[asyncio.Future[str]] = []  # pieces before the last pause, in order
        self._chunks: list[np.ndarray] = []  # audio after the last settled piece
        self._speculation: asyncio.Future[str] | None = None  # over _chunks[:_covered]
        self._covered = 0
        self._running: asyncio.Future[str] | None = None  # the last transcription started
        self._quiet_ms = 0.0
        self._speech = False  # loud audio among _chunks
        self.transcriptions = 0  # started, for tests and figures

    def add(self, audio: np.ndarray) -> None:
        """Take the next piece of the turn's audio (mono float32)."""
        self._chunks.append(audio)
        if audio.size and float(np.sqrt(np.mean(audio**2))) >= QUIET_RMS:
            self._quiet_ms = 0.0
            if self._speculation is not None:
                covered_s = sum(c.size for c in self._chunks[: self._covered]) / self._rate
                if covered_s >= SETTLE_AFTER_S:
                    # The caller went on: the guess stands for the audio it covered.
                    self._settled.append(self._speculation)
                    self._chunks = self._chunks[self._covered :]
                self._speculation = None
            self._speech = True
        else:
            self._quiet_ms += 1000.0 * audio.size / self._rate
        if (self._speculation is None and self._speech and self._quiet_ms >= SPECULATE_AFTER_QUIET_MS
                and not self._busy()):
            self._covered = len(self._chunks)
            self._speculation = self._start(self._chunks)

    async def text(self) -> str:
        """The whole turn's words, once its audio has all been added."""
        parts = [await piece for piece in self._settled]
        if self._speculation is not None:
            # Only quiet audio followed it, so it holds the rest of the turn's words.
            parts.append(await self._speculation)
        elif self._speech:
            if self._running is not None and not self._running.done():  # busy
                await asyncio.wait([self._running])  # a dropped guess still holds the pool
            parts.append(await self._start(self._chunks))
        return " ".join(part for part in parts if part)

    def _busy(self) -> bool:
        return self._running is not None and not self._running.done()

    def _start(self, chunks: list[np.ndarray]) -> asyncio.Future[str]:
        self.transcriptions += 1
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        self._running = asyncio.ensure_future(self._transcribe(audio))
        return self._running
