"""Early detection of caller sound at the edge, for barge-in: Silero scores per 32 ms window."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duplex_agent.agent.models.vad import VAD_RATE, SharedScores, VadModel, VadStream
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.webrtc.media.latency import ArrivalClock


@dataclass(frozen=True, slots=True)
class ScoredWindow:
    probability: float
    arrived_at: float  # perf_counter time the frame holding the window's first sample arrived


class CallerOnsetDetector:
    """Silero VAD over the caller's audio, window by window.

    ``push`` returns each new window's speech probability with the arrival time of the
    frame holding its first sample, so that latency counts from when that sound reached
    us; what the windows mean for the agent is the barge-in gate's to judge. The window
    scores (``scores``) serve the session's turn detection too: one VAD pass per call.
    """

    def __init__(self, model: VadModel) -> None:
        self.scores = SharedScores()
        self._vad = VadStream(model, scores_out=self.scores, sample_rate=VAD_RATE)
        self._resampler: StreamingResampler | None = None
        self.arrivals = ArrivalClock()
        self.window_ms = self._vad.window_ms

    def push(self, samples: np.ndarray, sample_rate: int, arrived_at: float) -> list[ScoredWindow]:
        """Feed mono float32 audio; the windows it completed, oldest first."""
        if self._resampler is None or self._resampler.in_rate != sample_rate:
            # Onset detection needs speed more than fidelity: "QQ" (cubic) holds ~0.1 ms,
            # where "LQ" holds 0-20 ms of each 20 ms frame.
            self._resampler = StreamingResampler(sample_rate, VAD_RATE, quality="QQ")
        self.arrivals.add(1000.0 * samples.size / sample_rate, arrived_at)
        self._vad.push(self._resampler.process(samples))
        probabilities = self._vad.probabilities
        first_ms = self._vad.position_ms - self.window_ms * len(probabilities)
        return [ScoredWindow(p, self.arrivals.arrival_of(first_ms + i * self.window_ms) or arrived_at)
                for i, p in enumerate(probabilities)]
