"""Early detection of caller speech at the edge, for barge-in."""

from __future__ import annotations

import numpy as np

from duplex_agent.agent.models.vad import VAD_RATE, SharedScores, VadModel, VadStream
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.webrtc.media.latency import ArrivalClock


class CallerOnsetDetector:
    """Silero VAD over the caller's audio with a short minimum speech run.

    ``push`` returns, when speech starts, the arrival time of the frame holding
    the onset sample, so that latency counts from when that sound reached us.
    Its window scores (``scores``) serve the session's turn detection too: one
    VAD pass per call.
    """

    def __init__(
        self,
        model: VadModel,
        *,
        threshold: float = 0.5,
        min_speech_ms: int = 32,
        silence_duration_ms: int = 300,
    ) -> None:
        self.scores = SharedScores()
        self._vad = VadStream(
            model,
            scores_out=self.scores,
            threshold=threshold,
            min_speech_ms=min_speech_ms,
            silence_duration_ms=silence_duration_ms,
            sample_rate=VAD_RATE,
        )
        self._resampler: StreamingResampler | None = None
        self.arrivals = ArrivalClock()

    @property
    def speaking(self) -> bool:
        return self._vad.speaking

    def push(self, samples: np.ndarray, sample_rate: int, arrived_at: float) -> float | None:
        """Feed mono float32 audio; the onset's arrival time when speech started in it, else None."""
        if self._resampler is None or self._resampler.in_rate != sample_rate:
            # Onset detection needs speed more than fidelity: "QQ" (cubic) holds ~0.1 ms,
            # where "LQ" holds 0-20 ms of each 20 ms frame.
            self._resampler = StreamingResampler(sample_rate, VAD_RATE, quality="QQ")
        self.arrivals.add(1000.0 * samples.size / sample_rate, arrived_at)
        onset_at = None
        for event in self._vad.push(self._resampler.process(samples)):
            if event.kind == "speech_started":
                onset_at = self.arrivals.arrival_of(event.audio_ms)
        return onset_at
