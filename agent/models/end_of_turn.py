"""Adaptive end of turn: the server VAD asks an audio end-of-turn model at each pause.

A fixed silence window makes every turn wait its full length, even after a finished
sentence. Here, when the caller has been quiet for a little while, the last 1.2 s of
their audio goes to LiveKit's audio end-of-turn model (``livekit-local-inference``,
weights in the wheel). If it says the turn is over (P >= ``end_of_turn_threshold``),
the turn ends after ``end_of_turn_silence_ms`` of silence; otherwise after the full
``silence_duration_ms``, as without the model.

The model is loaded once per process and runs on one thread of its own, off every
event loop; sessions hand it snapshots and pick up the answer on a later push.

Each inference runs on that one thread alone (``EOT_PARALLELISM=none``, unless the
environment says otherwise). The library's default spreads one inference over helper
threads it starts for each call: it answers sooner, but costs more CPU per inference than
one thread does (``python -m bench.end_of_turn_cost`` prints both). A worker serving many
calls wants the CPU, and one thread's answer still fits in the probe's lead. On one thread, the inference's CPU is also exactly the
thread's, so the worker can count it (``duplex_end_of_turn_cpu_seconds``).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from duplex_agent.agent.metrics import END_OF_TURN_CONFIDENT, END_OF_TURN_CPU_SECONDS, END_OF_TURN_INFERENCES
from duplex_agent.agent.models.model_errors import require_module
from duplex_agent.agent.models.shared_model import SharedModel
from duplex_agent.agent.models.vad import SharedScores, VadEvent, VadModel, VadSettings, VadStream, to_int16

logger = logging.getLogger("duplex_agent.models")

#: The model's receptive field: 1.2 s at 16 kHz.
CONTEXT_SAMPLES = 19200
#: The question goes out this long before the short window closes, so the answer
#: (about 20-40 ms of inference) is back when it does.
PROBE_LEAD_MS = 64.0


class EndOfTurnModel(SharedModel):
    """LiveKit's audio end-of-turn model: P(turn ended) for up to 1.2 s of 16 kHz audio."""

    def __init__(self) -> None:
        lib = require_module("livekit.local_inference", "livekit-local-inference", "the end-of-turn model")
        start = time.perf_counter()
        os.environ.setdefault("EOT_PARALLELISM", "none")  # read once, when the model loads
        lib.init_eot()
        assert lib.EOT_MAX_SAMPLES == CONTEXT_SAMPLES
        self._eot = lib.EOT()
        # One thread for every session of the process: inference releases the GIL, and a
        # queue of short questions beats threads fighting over two cores.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="end-of-turn")
        self.asked = 0  # questions so far, and answers: for figures, and for tests to wait on
        self.answered = 0
        logger.info("end-of-turn model loaded in %.2f s", time.perf_counter() - start)

    def probability(self, samples: np.ndarray) -> float:
        """P(turn ended) for mono float32 16 kHz audio ending now (its last 1.2 s are used)."""
        started = time.thread_time()
        p = float(self._eot.predict(to_int16(samples[-CONTEXT_SAMPLES:])))
        END_OF_TURN_CPU_SECONDS.inc(time.thread_time() - started)
        return p

    def ask(self, samples: np.ndarray) -> Future[float]:
        """``probability`` on the model's own thread; the future is not bound to any loop."""
        self.asked += 1
        END_OF_TURN_INFERENCES.inc()
        future = self._thread.submit(self.probability, samples)
        future.add_done_callback(self._count_answer)
        return future

    def _count_answer(self, _: Future[float]) -> None:
        self.answered += 1


class TurnDetector:
    """A VadStream whose pauses end the turn early when the end-of-turn model is confident.

    Same surface as VadStream for its owner (push, speaking, position_ms, reset). With no
    model (``end_of_turn`` off), it is the VadStream alone.
    """

    def __init__(
        self,
        vad: VadStream,
        model: EndOfTurnModel | None,
        *,
        threshold: float = 0.5,
        silence_ms: float = 200.0,
    ) -> None:
        self.vad = vad
        self._model = model
        self.threshold = threshold
        self.silence_ms = float(silence_ms)
        self._probe_at_ms = max(vad.window_ms, self.silence_ms - PROBE_LEAD_MS)
        self._recent = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)  # a ring: the last 1.2 s
        self._write = 0  # where the next sample goes
        self._probe: Future[float] | None = None
        self._probed_pause: float | None = None  # speech_end_ms of the pause asked about
        self.last_probability: float | None = None

    @classmethod
    def from_settings(cls, settings: VadSettings, vad_model: VadModel, eot_model: EndOfTurnModel | None,
                      *, scores_in: SharedScores | None = None) -> TurnDetector:
        return cls(settings.new_stream(vad_model, scores_in=scores_in), eot_model if settings.end_of_turn else None,
                   threshold=settings.end_of_turn_threshold, silence_ms=settings.end_of_turn_silence_ms)

    def retune(self, settings: VadSettings, eot_model: EndOfTurnModel | None) -> None:
        """New settings mid-session: the stream keeps its timeline (and its shared scores' grid)."""
        self.vad.tune(**settings.stream_settings())
        self._model = eot_model if settings.end_of_turn else None
        self.threshold = settings.end_of_turn_threshold
        self.silence_ms = float(settings.end_of_turn_silence_ms)
        self._probe_at_ms = max(self.vad.window_ms, self.silence_ms - PROBE_LEAD_MS)
        self._probe = None

    @property
    def speaking(self) -> bool:
        return self.vad.speaking

    @property
    def position_ms(self) -> float:
        return self.vad.position_ms

    @property
    def probing(self) -> bool:
        """A question about the current pause is with the model."""
        return self._probe is not None

    def reset(self) -> None:
        self.vad.reset()
        self._probe = None
        self._probed_pause = None

    def wait_for_probe(self) -> None:
        """Block until the question in flight (if any) is answered; the next push reads it."""
        if self._probe is not None:
            self._probe.result()

    def push(self, samples: np.ndarray) -> list[VadEvent]:
        """Consume mono float32 16 kHz audio; return the VAD's events, early ends included."""
        samples = np.asarray(samples, dtype=np.float32)
        events = self.vad.push(samples)
        self._remember(samples)
        if self._model is None:
            return events
        if self.vad.silence_ms == 0.0 or self._probed_pause != self.vad.speech_end_ms:
            self._probe = None  # speech resumed or the turn ended: that answer is moot
        if self._probe is not None and self._probe.done():
            early = self._answer(self._probe)
            self._probe = None
            if early is not None:
                events.append(early)
        if (self._probe is None and self._probed_pause != self.vad.speech_end_ms
                and self.vad.silence_ms >= self._probe_at_ms):
            self._probed_pause = self.vad.speech_end_ms
            self._probe = self._model.ask(np.roll(self._recent, -self._write))  # oldest first
        return events

    def _remember(self, samples: np.ndarray) -> None:
        samples = samples[-CONTEXT_SAMPLES:]
        first = min(samples.size, CONTEXT_SAMPLES - self._write)
        self._recent[self._write : self._write + first] = samples[:first]
        self._recent[: samples.size - first] = samples[first:]
        self._write = (self._write + samples.size) % CONTEXT_SAMPLES

    def _answer(self, probe: Future[float]) -> VadEvent | None:
        try:
            p = probe.result()
        except Exception:
            logger.exception("end-of-turn model failed; this pause waits the full window")
            return None
        self.last_probability = p
        if p < self.threshold:
            return None
        END_OF_TURN_CONFIDENT.inc()
        return self.vad.end_pause_after(self.silence_ms)
