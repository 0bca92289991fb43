"""The agent's audio output of one call: the model's audio in, paced 48 kHz frames out.

Shaped like livekit-agents' ``AudioOutput``: ``capture_frame`` a response's audio,
``flush`` when the response has no more, ``clear_buffer`` to stop at once, and one
``on_playback_finished`` per response with the position played and whether it was
interrupted; the call path turns that into the model's ``PlaybackAck``.

Between the model and the playout queue: a streaming resampler per response to 48 kHz,
and for a frame-synchronous model a jitter hold (a response's first unit is held back
before its playout starts). ``pause``/``resume`` hold the reply where it is.

What it remembers per response is bounded: a response's resampler, hold and marks go
when it ends; of ended responses only the last ``RECENT_RESPONSES_KEPT`` are kept (to
drop a cancelled reply's late deltas and to ack each once).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from duplex_agent.agent.metrics import PLAYOUT_UNDERRUNS
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.agent.protocol.events import ResponseAudioDelta
from duplex_agent.agent.session.ledger import TextMark, text_heard_by
from duplex_agent.webrtc.media.playout import SAMPLE_RATE, PlaybackFinished, PlayoutProgress, PlayoutQueue

#: soxr quality for both directions. soxr releases output in blocks: "LQ" holds back
#: 0-20 ms (11 ms on average) of 20 ms chunks between 16 and 48 kHz, ~1 ms from 22.05
#: kHz; "HQ" holds back 20-33 ms. LQ keeps an anti-aliasing filter, which ASR wants.
RESAMPLE_QUALITY = "LQ"
#: Ended responses remembered (a late delta of a cut one is dropped, an ack goes once):
#: far more than are ever live or in flight at once in one call.
RECENT_RESPONSES_KEPT = 64


@dataclass(frozen=True, slots=True)
class PlaybackEnded:
    """One response is over for the caller (livekit-agents' ``PlaybackFinishedEvent``)."""

    response_id: str
    playback_position_ms: float  # what the caller heard of it
    interrupted: bool  # cleared or cancelled (not played to its end)
    heard_text: str | None  # when interrupted and the reply had word marks: the words heard


class RecentIds:
    """A set of response ids that keeps only the most recently added ``keep``."""

    def __init__(self, keep: int = RECENT_RESPONSES_KEPT) -> None:
        self._keep = keep
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, response_id: str) -> None:
        self._ids[response_id] = None
        self._ids.move_to_end(response_id)
        while len(self._ids) > self._keep:
            self._ids.popitem(last=False)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class AgentAudioOutput:
    def __init__(
        self,
        *,
        on_playback_finished: Callable[[PlaybackEnded], None],
        on_cleared: Callable[[], None] | None = None,
        jitter_ms: float = 0.0,
        playout: PlayoutQueue | None = None,
    ) -> None:
        self.playout = playout if playout is not None else PlayoutQueue()
        self._on_playback_finished = on_playback_finished
        # A transport with its own output queue (LiveKit's AudioSource) empties it here.
        self._on_cleared = on_cleared
        self._jitter_ms = jitter_ms
        self._resamplers: dict[str, StreamingResampler] = {}
        self._first_delta_at: dict[str, float] = {}  # response -> when its first delta arrived
        self._marks: dict[str, list[TextMark]] = {}  # response -> which words span which audio
        self._held: dict[str, list[np.ndarray]] = {}  # response -> audio held back before its playout starts
        self._held_ms: dict[str, float] = {}
        self._released: set[str] = set()  # responses whose playout has started
        self._dropped = RecentIds()  # cleared or cancelled: late deltas are dropped
        self._acked = RecentIds()
        self._underruns_seen = 0

    # ---- the model's side ----

    def capture_frame(self, delta: ResponseAudioDelta) -> None:
        """One audio delta of a response: resample to 48 kHz, hold or queue it."""
        received_at = time.perf_counter()
        rid = delta.response_id
        if rid in self._dropped:
            return
        resampler = self._resamplers.get(rid)
        if resampler is None or resampler.in_rate != delta.sample_rate:
            resampler = self._resamplers[rid] = StreamingResampler(delta.sample_rate, SAMPLE_RATE, quality=RESAMPLE_QUALITY)
        first_at = self._first_delta_at.setdefault(rid, received_at)
        self._marks.setdefault(rid, []).extend(
            TextMark(str(m["text"]), float(m["start_ms"]), float(m["end_ms"])) for m in delta.marks)
        audio = resampler.process(delta.audio)
        if self._jitter_ms and rid not in self._released:
            self._held.setdefault(rid, []).append(audio)
            self._held_ms[rid] = self._held_ms.get(rid, 0.0) + delta.audio_ms
            if self._held_ms[rid] <= self._jitter_ms:
                return
            audio = self._release_held(rid)
            self._released.add(rid)
        self.playout.capture(audio, rid, tag=first_at)

    def flush(self, response_id: str) -> None:
        """The response has no more audio: what is held and in the resampler goes out."""
        first_at = self._first_delta_at.pop(response_id, None)
        self._released.discard(response_id)
        if response_id in self._held_ms and response_id not in self._dropped:
            self.playout.capture(self._release_held(response_id), response_id, tag=first_at)
        resampler = self._resamplers.pop(response_id, None)
        if resampler is not None and response_id not in self._dropped:
            self.playout.capture(resampler.flush(), response_id)
        self.playout.flush(response_id)

    def clear_buffer(self) -> None:
        """Stop everything now, held audio included; each response is acked where it got to."""
        for response_id in self.playout.clear().response_ids + list(self._held_ms):
            self._forget(response_id)
            self.acknowledge(response_id)
        self._cleared()

    def interrupt(self) -> list[str]:
        """Stop what is playing and queued now (a barge-in); the responses cut, the one
        heard first. Their acks wait for ``acknowledge``, so that the cancel goes first."""
        current = self.playout.current_response_id
        cleared = self.playout.clear()
        self._cleared()
        responses = cleared.response_ids
        if current is not None and current not in responses:
            responses.insert(0, current)
        for response_id in responses:
            self._forget(response_id)
        return responses

    def drop(self, response_id: str) -> None:
        """One response is cancelled: none of the rest of it is played; acked where it got to."""
        self._forget(response_id)
        if self.playout.drop_response(response_id):
            self._cleared()
        self.acknowledge(response_id)

    def pause(self) -> bool:
        return self.playout.pause()

    def resume(self) -> bool:
        return self.playout.resume()

    def acknowledge(self, response_id: str) -> None:
        """Report the response's end once, at the position played."""
        if response_id in self._acked:
            return
        self._acked.add(response_id)
        played_ms = self.playout.played_ms(response_id)
        marks = self._marks.pop(response_id, [])
        interrupted = response_id in self._dropped
        heard = text_heard_by(marks, played_ms) if interrupted and marks else None
        self._on_playback_finished(PlaybackEnded(response_id, played_ms, interrupted, heard))

    @property
    def receiving(self) -> bool:
        """Audio of some response is still coming (its resampler is open)."""
        return bool(self._resamplers)

    @property
    def remembered_responses(self) -> int:
        """How many responses this output keeps anything about (bounded over a call)."""
        live = (self._resamplers.keys() | self._first_delta_at.keys() | self._marks.keys()
                | self._held.keys() | self._held_ms.keys() | self._released)
        return len(live) + len(self._dropped) + len(self._acked)

    # ---- the pacing side ----

    def next_frame(self) -> tuple[np.ndarray, list[PlayoutProgress]]:
        """The next 20 ms for the caller (int16, 960 samples at 48 kHz) and what it did;
        a response played to its end is acknowledged here."""
        frame = self.playout.next_frame()
        progress = self.playout.take_progress()
        for event in progress:
            if isinstance(event, PlaybackFinished):
                self.acknowledge(event.response_id)
        if self.playout.underruns > self._underruns_seen:
            PLAYOUT_UNDERRUNS.inc(self.playout.underruns - self._underruns_seen)
            self._underruns_seen = self.playout.underruns
        return frame, progress

    def _forget(self, response_id: str) -> None:
        """A cut response: none of its audio is played any more; only its ack is to come."""
        self._first_delta_at.pop(response_id, None)
        self._release_held(response_id)
        self._released.discard(response_id)
        self._resamplers.pop(response_id, None)
        self._dropped.add(response_id)

    def _release_held(self, response_id: str) -> np.ndarray:
        self._held_ms.pop(response_id, None)
        return np.concatenate(self._held.pop(response_id, [np.zeros(0, np.float32)]))

    def _cleared(self) -> None:
        if self._on_cleared is not None:
            self._on_cleared()
