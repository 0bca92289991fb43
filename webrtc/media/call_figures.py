"""One call's timings as the caller hears them, from the frames that go out.

Barge-in (onset to the first silent frame, or to the pause's fade-out), the length of
a false pause, the turn (end of the caller's speech to the reply's first frame) and
the output's added latency (first delta to first frame). Each goes into the call's
``LatencyFigures`` and the process's histograms.
"""

from __future__ import annotations

import logging

from duplex_agent.agent.metrics import BARGE_IN_LATENCY_MS, FALSE_PAUSE_MS, TURN_LATENCY_MS
from duplex_agent.webrtc.media.latency import LatencyFigures
from duplex_agent.webrtc.media.playout import ChunkStarted, PlaybackPaused, PlaybackResumed, PlayoutProgress

logger = logging.getLogger("duplex_agent.webrtc")


class CallTimings:
    """Measurements in flight (perf_counter seconds) and the figures they become."""

    def __init__(self, figures: LatencyFigures) -> None:
        self.figures = figures
        self._barge_in_onset_at: float | None = None  # a barge-in's onset, until its first silent frame
        self._paused_at: float | None = None  # when the pause's fade-out went out
        self._speech_end_at: float | None = None  # when the end of the caller's speech arrived

    def forget_pause_heard(self) -> None:
        """Forget when a pause's fade-out went out: a new pause (or a resume) was asked, and
        no fade-out of it has gone out yet."""
        self._paused_at = None

    def take_pause_heard_at(self) -> float | None:
        """When the asked pause's fade-out went out, if it has; forgotten once taken."""
        paused_at, self._paused_at = self._paused_at, None
        return paused_at

    def barge_in(self, onset_at: float, *, silent_at: float | None) -> None:
        """A confirmed barge-in: silent already at ``silent_at``, else at the next frame."""
        if silent_at is not None:
            self._record_barge_in(1000.0 * (silent_at - onset_at))
        else:
            self._barge_in_onset_at = onset_at

    def speech_ended(self, at: float | None) -> None:
        self._speech_end_at = at

    def frame_out(self, progress_made: list[PlayoutProgress], now: float) -> None:
        """A frame went out at ``now``, doing ``progress_made``."""
        if self._barge_in_onset_at is not None:
            self._record_barge_in(1000.0 * (now - self._barge_in_onset_at))
            self._barge_in_onset_at = None
        for progress in progress_made:
            if isinstance(progress, PlaybackPaused):
                self._paused_at = now
            elif isinstance(progress, PlaybackResumed):
                self.figures.record("false_pause_ms", progress.silent_ms)
                FALSE_PAUSE_MS.observe(progress.silent_ms)
            elif isinstance(progress, ChunkStarted) and progress.first_of_response:
                if progress.tag is not None:
                    self.figures.record("output_added_ms", 1000.0 * (now - progress.tag))
                if self._speech_end_at is not None:
                    ms = 1000.0 * (now - self._speech_end_at)
                    self._speech_end_at = None
                    self.figures.record("turn_ms", ms)
                    TURN_LATENCY_MS.observe(ms)
                    logger.debug("turn_ms: reply heard %.1f ms after the end of the caller's speech", ms)

    def _record_barge_in(self, ms: float) -> None:
        self.figures.record("barge_in_ms", ms)
        BARGE_IN_LATENCY_MS.observe(ms)
        logger.info("barge-in: silent %.1f ms after the caller's speech onset (barge_in_ms)", ms)
