"""The agent's outgoing audio: a queue of 48 kHz samples read out in 20 ms frames.

The queue is the last stage of the call's audio output (agent_output.py): ``capture`` a
response's 48 kHz audio, ``flush`` when it has no more, ``clear`` to stop at once,
``PlaybackFinished`` (position played, interrupted or not) when it is over. The
transports read it out with ``next_frame``.

``pause`` holds the queue where it is (a short fade-out, then silence, nothing consumed);
``resume`` goes on from the next sample with a short fade-in, so a reply paused for a sound
that was not a barge-in loses nothing but the pause itself. A transport with a queue of its
own after this one (LiveKit's AudioSource) empties it at a pause and gives back what it held
(``take_back``): that audio plays after the resume, and it never counted as heard.

The queue is the single place that knows what the caller has heard: every frame
handed out is booked against the response it came from, so a barge-in can
acknowledge exactly the played position. ``clear()`` takes effect on the very
next frame.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FRAME_MS = 1000.0 * FRAME_SAMPLES / SAMPLE_RATE
_PLAYED_RECORDS_KEPT = 64  # responses whose played duration is remembered
#: Frames handed out that ``take_back`` can return: 120 ms, more than a transport's own queue
#: holds (LiveKit's source: 40-80 ms, its 40 ms captures counted).
_HANDED_KEPT = 6
#: Pause and resume ramp over 5 ms: long enough that the step between samples stays at the
#: signal's own (no click), short enough that the pause is heard within the frame it lands in.
FADE_SAMPLES = 240
_FADE_OUT = ((FADE_SAMPLES - np.arange(FADE_SAMPLES)) / FADE_SAMPLES).astype(np.float32)  # 1 .. 1/240
_FADE_IN = _FADE_OUT[::-1].copy()  # 1/240 .. 1


@dataclass(slots=True)
class _Chunk:
    samples: np.ndarray  # float32, not yet played
    response_id: str
    tag: Any  # caller's marker, reported when the chunk's first sample is played
    started: bool = False


@dataclass(frozen=True, slots=True)
class ChunkStarted:
    """The first sample of a pushed chunk went out in the last frame."""

    response_id: str
    tag: Any
    first_of_response: bool


@dataclass(frozen=True, slots=True)
class PlaybackFinished:
    """A response's playback is over: all of it went out, or it was cut (``interrupted``)
    after ``played_ms`` of it had gone out."""

    response_id: str
    played_ms: float
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class Cleared:
    """What ``clear()`` dropped: samples per response, in queue order."""

    dropped_samples: dict[str, int] = field(default_factory=dict)

    @property
    def response_ids(self) -> list[str]:
        return list(self.dropped_samples)

    def dropped_ms(self, response_id: str) -> float:
        return 1000.0 * self.dropped_samples.get(response_id, 0) / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class PlaybackPaused:
    """The last frame faded the agent out (``pause``): the first frame the caller hears as quiet."""

    response_id: str | None


@dataclass(frozen=True, slots=True)
class PlaybackResumed:
    """The last frame faded the agent back in after a pause of ``silent_ms`` of silence
    (between the fade-out's last sample and the fade-in's first)."""

    response_id: str | None
    silent_ms: float


PlayoutProgress = ChunkStarted | PlaybackFinished | PlaybackPaused | PlaybackResumed


@dataclass(frozen=True, slots=True)
class _Handed:
    """One frame handed out: its audio by response, in order, then ``padding`` samples of silence."""

    audio: tuple[tuple[str, np.ndarray], ...]
    padding: int


_SILENT_FRAME = _Handed((), FRAME_SAMPLES)


class PlayoutQueue:
    """Mono 48 kHz float32 in, int16 frames of 960 samples out; silence when empty.

    Producers call ``capture``/``flush``/``clear`` from the event loop; the pacing
    side calls ``next_frame`` and then ``take_progress`` for what that frame did
    (responses that played out to the end are among it; cut ones are what
    ``clear`` and ``drop_response`` return). A lock keeps both sides consistent if
    the pacing runs on another thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: deque[_Chunk] = deque()
        self._queued_samples = 0
        self._played: OrderedDict[str, int] = OrderedDict()  # response -> samples played
        self._finished: set[str] = set()  # no more audio will be pushed for these
        self._streaming: str | None = None  # response that started playing and has not finished
        self._progress: list[PlayoutProgress] = []
        self._ended: OrderedDict[str, PlaybackFinished] = OrderedDict()  # recent ends: each ends once
        self._audio_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._last_frame_had_audio = False
        # Pause: _paused holds the queue; _fade_out is the fade still to play, _fade_in the one
        # the first frame after the resume plays; _silent_samples the pause's silence so far.
        self._paused = False
        self._fade_out = False
        self._fade_in = False
        self._silent_samples = 0
        self._pause_unheard = False  # paused, and no frame has gone out since
        self._handed: deque[_Handed] = deque(maxlen=_HANDED_KEPT)
        self.underruns = 0
        self.frames_out = 0

    # ---- producer side ----

    def capture(self, samples: np.ndarray, response_id: str, *, tag: Any = None) -> None:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            return
        with self._lock:
            if response_id in self._finished:
                return
            self._chunks.append(_Chunk(samples, response_id, tag))
            self._queued_samples += samples.size
            waiting, self._audio_waiters = self._audio_waiters, []
        for loop, future in waiting:
            loop.call_soon_threadsafe(_settle, future, None)

    def flush(self, response_id: str) -> None:
        """No more audio follows for ``response_id``; its end will be reported once played."""
        with self._lock:
            if response_id in self._finished:
                return
            self._finished.add(response_id)
            if not any(c.response_id == response_id for c in self._chunks) and self._played.get(response_id):
                self._report_played(response_id)

    def clear(self) -> Cleared:
        """Drop everything queued; the next frame is silence. Cleared responses count as finished."""
        with self._lock:
            dropped: dict[str, int] = {}
            for chunk in self._chunks:
                dropped[chunk.response_id] = dropped.get(chunk.response_id, 0) + chunk.samples.size
            self._chunks.clear()
            self._queued_samples = 0
            self._last_frame_had_audio = False
            self._handed.clear()
            self._unpause()
            if self._streaming is not None:
                dropped.setdefault(self._streaming, 0)
                self._streaming = None
            for response_id in dropped:
                self._finished.add(response_id)
                self._end(response_id, interrupted=True)
            return Cleared(dropped)

    def drop_response(self, response_id: str) -> int:
        """Drop the queued audio of one response; returns the samples dropped."""
        with self._lock:
            kept = deque(c for c in self._chunks if c.response_id != response_id)
            dropped = self._queued_samples - sum(c.samples.size for c in kept)
            self._chunks = kept
            self._queued_samples -= dropped
            self._finished.add(response_id)
            if self._streaming == response_id:
                self._streaming = None
                self._unpause()  # the paused reply is gone: what follows plays as it comes
            if response_id not in self._ended:
                self._end(response_id, interrupted=True)
            return dropped

    def pause(self) -> bool:
        """Hold the queue: the next frame fades out over FADE_SAMPLES, then silence, nothing
        consumed. False (and nothing done) when nothing plays or it is paused already."""
        with self._lock:
            if self._paused or not (self._chunks or self._last_frame_had_audio):
                return False
            self._paused = True
            self._pause_unheard = True
            self._fade_out = bool(self._chunks)
            self._fade_in = False
            self._silent_samples = 0
            return True

    def resume(self) -> bool:
        """Go on from the next sample after the pause, fading in; False when not paused."""
        with self._lock:
            if not self._paused:
                return False
            self._paused = self._pause_unheard = False
            # A pause that no frame played yet was never heard: nothing to fade back from.
            self._fade_in = not self._fade_out
            self._fade_out = False
            if not self._fade_in:
                self._silent_samples = 0
            return True

    def take_back(self, ms: float) -> bool:
        """The last ``ms`` handed out never played (a transport's own queue dropped them at a
        pause): queue their audio again, to fade out now and play after the resume; unheard.

        Only while no frame has gone out since the pause, and only audio of the reply paused
        (one that ended inside those ``ms`` was reported played): False, and nothing done,
        otherwise, and the transport keeps its queue.
        """
        with self._lock:
            wanted = round(ms * SAMPLE_RATE / 1000.0)
            if not (self._pause_unheard and self._streaming is not None) or wanted <= 0:
                return False
            taken: list[np.ndarray] = []  # newest first
            left = wanted
            for handed in reversed(self._handed):  # each frame's audio, then its padding
                left -= handed.padding
                for response_id, samples in reversed(handed.audio):
                    if left <= 0:
                        break
                    if response_id != self._streaming:
                        return False
                    take = min(left, samples.size)
                    taken.append(samples[samples.size - take:])
                    left -= take
                if left <= 0:
                    break
            if left > 0 or not taken:  # more than is kept, or silence only
                return False
            audio = np.concatenate(taken[::-1])
            self._handed.clear()  # what is kept now starts after the resume
            self._chunks.appendleft(_Chunk(audio, self._streaming, None, started=True))
            self._queued_samples += audio.size
            self._played[self._streaming] -= audio.size
            self._fade_out = True
            return True

    def _unpause(self) -> None:
        self._paused = self._fade_out = self._fade_in = self._pause_unheard = False
        self._silent_samples = 0

    # ---- pacing side ----

    def next_frame(self) -> np.ndarray:
        """The next 20 ms as int16; silence where the queue ran dry or is paused."""
        with self._lock:
            self._pause_unheard = False
            if self._paused and not self._fade_out:  # held: silence, nothing consumed
                return self._silent_frame(paused=True)
            if not self._chunks:  # the common case while the caller talks: no float work at all
                if not self._paused and self._streaming is not None:
                    self.underruns += 1
                self._fade_out = False
                return self._silent_frame(paused=self._paused)
            out = np.zeros(FRAME_SAMPLES, dtype=np.float32)
            if self._fade_out:
                filled = self._fill(out, FADE_SAMPLES)
                out[:filled] *= _FADE_OUT[:filled]
                self._fade_out = False
                self._silent_samples = FRAME_SAMPLES - filled
                self._progress.append(PlaybackPaused(self._streaming))
            else:
                filled = self._fill(out, FRAME_SAMPLES)
                if self._fade_in:
                    ramp = min(filled, FADE_SAMPLES)
                    out[:ramp] *= _FADE_IN[:ramp]
                    self._fade_in = False
                    self._progress.append(PlaybackResumed(self._streaming, 1000.0 * self._silent_samples / SAMPLE_RATE))
                    self._silent_samples = 0
                if filled < FRAME_SAMPLES and self._streaming is not None:
                    self.underruns += 1
            while len(self._played) > _PLAYED_RECORDS_KEPT:
                self._played.popitem(last=False)
            self._last_frame_had_audio = filled > 0 and not self._paused
            self.frames_out += 1
        np.multiply(out, 32767.0, out=out)
        np.clip(out, -32767.0, 32767.0, out=out)
        return out.astype(np.int16)

    def _silent_frame(self, *, paused: bool) -> np.ndarray:
        if paused:
            self._silent_samples += FRAME_SAMPLES
        self._last_frame_had_audio = False
        self.frames_out += 1
        self._handed.append(_SILENT_FRAME)
        return np.zeros(FRAME_SAMPLES, dtype=np.int16)

    def _fill(self, out: np.ndarray, limit: int) -> int:
        """Move up to ``limit`` queued samples into ``out``, booking each against its response
        (and keeping the frame's audio for ``take_back``)."""
        filled = 0
        handed: list[tuple[str, np.ndarray]] = []
        while filled < limit and self._chunks:
            chunk = self._chunks[0]
            if not chunk.started:
                chunk.started = True
                first = chunk.response_id not in self._played
                self._played.setdefault(chunk.response_id, 0)
                self._played.move_to_end(chunk.response_id)
                self._streaming = chunk.response_id
                self._progress.append(ChunkStarted(chunk.response_id, chunk.tag, first))
            take = min(limit - filled, chunk.samples.size)
            out[filled : filled + take] = chunk.samples[:take]
            handed.append((chunk.response_id, chunk.samples[:take]))
            chunk.samples = chunk.samples[take:]
            filled += take
            self._queued_samples -= take
            self._played[chunk.response_id] += take
            if chunk.samples.size == 0:
                self._chunks.popleft()
                rid = chunk.response_id
                if rid in self._finished and not any(c.response_id == rid for c in self._chunks):
                    self._report_played(rid)
        self._handed.append(_Handed(tuple(handed), FRAME_SAMPLES - filled))
        return filled

    def take_progress(self) -> list[PlayoutProgress]:
        """What the frames since the last call did: chunk starts, pauses heard, resumes and
        finished responses."""
        with self._lock:
            progress, self._progress = self._progress, []
            return progress

    # ---- state ----

    def played_ms(self, response_id: str) -> float:
        with self._lock:
            return 1000.0 * self._played.get(response_id, 0) / SAMPLE_RATE

    @property
    def queued_ms(self) -> float:
        return 1000.0 * self._queued_samples / SAMPLE_RATE

    @property
    def playing(self) -> bool:
        """Agent audio is going out now or is queued to (paused with audio queued included)."""
        with self._lock:
            return bool(self._chunks) or self._last_frame_had_audio

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._paused

    @property
    def current_response_id(self) -> str | None:
        """The response being heard now, else the next one queued."""
        with self._lock:
            if self._streaming is not None:
                return self._streaming
            return self._chunks[0].response_id if self._chunks else None

    async def wait_for_audio(self) -> None:
        """Until audio is queued (at once if some is): a transport that need not send
        silence waits here instead of reading out silent frames."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._chunks:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._audio_waiters.append((loop, future))
        await future

    def wake(self) -> None:
        """Wake those waiting in ``wait_for_audio`` though nothing is queued: a sound the call
        path plays where the queue is silent (the hold sound) is to be sent."""
        with self._lock:
            waiting, self._audio_waiters = self._audio_waiters, []
        for loop, future in waiting:
            loop.call_soon_threadsafe(_settle, future, None)

    def _report_played(self, response_id: str) -> None:
        if self._streaming == response_id:
            self._streaming = None
        self._progress.append(self._end(response_id, interrupted=False))

    def _end(self, response_id: str, *, interrupted: bool) -> PlaybackFinished:
        """Record a response's end (under the lock, from any thread)."""
        ended = PlaybackFinished(response_id, 1000.0 * self._played.get(response_id, 0) / SAMPLE_RATE, interrupted)
        self._ended[response_id] = ended
        while len(self._ended) > _PLAYED_RECORDS_KEPT:
            self._ended.popitem(last=False)
        return ended


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)
