"""Early detection of caller sound at the edge, for barge-in: Silero scores per 32 ms window,
and while the agent speaks on a second grid half a window later, so that a window ends every 16 ms."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duplex_agent.agent.models.vad import VAD_RATE, WINDOW_SAMPLES, SharedScores, VadModel, VadStream
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.webrtc.media.latency import ArrivalClock


@dataclass(frozen=True, slots=True)
class ScoredWindow:
    probability: float
    arrived_at: float  # perf_counter time the frame holding the window's first sample arrived
    end_ms: float  # where the window ends on the call's input timeline (16 kHz samples in, as ms)
    half_step: bool = False  # a window of the offset grid: it may start a pause, not weigh in a verdict
    level_db: float | None = None  # the window's RMS level (dBFS)


class CallerOnsetDetector:
    """Silero VAD over the caller's audio, window by window.

    ``push`` returns each new window's speech probability with the arrival time of the
    frame holding its first sample, so that latency counts from when that sound reached
    us; what the windows mean for the agent is the barge-in gate's to judge. The main grid's
    window scores (``scores``) serve the session's turn detection too: one VAD pass per call.

    While a pause could be made (``half_step``: the agent speaks), a second stream scores the
    same audio on a grid half a window (16 ms) later. Silero keeps state across windows, so a
    window cannot slide over each new frame; a second grid can. With one grid a 32 ms window
    ends 0-28 ms before the 20 ms frame that completes it arrives, and speech that starts late
    in a window waits for the next; with two, a window ends within 16 ms before each frame. Its
    windows serve only the first sign of sound (the gate pauses on them, and counts speech on
    the main grid's, as the session's VAD does). It starts fresh each time, as a call's stream
    does, so it costs a second pass only over the agent's replies.
    """

    def __init__(self, model: VadModel) -> None:
        self._model = model
        self.scores = SharedScores()
        self._vad = VadStream(model, scores_out=self.scores, sample_rate=VAD_RATE)
        self._half_step_vad: VadStream | None = None
        self._half_step_origin = 0  # where on the input timeline (16 kHz samples) that stream began
        self._fed = 0  # 16 kHz samples of input so far
        self.half_step_windows_scored = 0  # the offset grid's model calls, all its streams together
        self._resampler: StreamingResampler | None = None
        self.arrivals = ArrivalClock()
        self.window_ms = self._vad.window_ms

    def push(self, samples: np.ndarray, sample_rate: int, arrived_at: float, *,
             half_step: bool) -> list[ScoredWindow]:
        """Feed mono float32 audio; the windows it completed, on the offset grid too while
        ``half_step``, in the order they end."""
        if self._resampler is None or self._resampler.in_rate != sample_rate:
            # Onset detection needs speed more than fidelity: "QQ" (cubic) holds ~0.1 ms,
            # where "LQ" holds 0-20 ms of each 20 ms frame.
            self._resampler = StreamingResampler(sample_rate, VAD_RATE, quality="QQ")
        self.arrivals.add(1000.0 * samples.size / sample_rate, arrived_at)
        resampled = self._resampler.process(samples)
        windows = self._scored(self._vad, resampled, 0, arrived_at)
        if not half_step:
            self._half_step_vad = None
        elif self._half_step_vad is None:
            skip = (WINDOW_SAMPLES // 2 - self._fed) % WINDOW_SAMPLES  # to the offset grid's next window start
            if skip < resampled.size:
                self._half_step_vad = VadStream(self._model, sample_rate=VAD_RATE)
                self._half_step_origin = self._fed + skip
        if self._half_step_vad is not None:  # from where it began, if that is in this push
            start = max(0, self._half_step_origin - self._fed)
            windows += self._scored(self._half_step_vad, resampled[start:], self._half_step_origin, arrived_at)
        self._fed += resampled.size
        return sorted(windows, key=lambda w: w.end_ms)

    def _scored(self, vad: VadStream, samples: np.ndarray, origin: int, arrived_at: float) -> list[ScoredWindow]:
        """``vad``'s new windows; ``origin``: where its stream began on the input timeline."""
        half_step = vad is not self._vad
        scored_before = vad.windows_scored
        vad.push(samples)
        if half_step:
            self.half_step_windows_scored += vad.windows_scored - scored_before
        first_ms = 1000.0 * origin / VAD_RATE + vad.position_ms - self.window_ms * len(vad.probabilities)
        return [ScoredWindow(p, self.arrivals.arrival_of(first_ms + i * self.window_ms) or arrived_at,
                             first_ms + (i + 1) * self.window_ms, half_step, level)
                for i, (p, level) in enumerate(zip(vad.probabilities, vad.levels, strict=True))]
