"""Appends at their own rate -> appends at the session's input rate.

vLLM-Omni lets every ``input_audio_buffer.append`` name its own ``format`` and
``sample_rate_hz``. The codec decodes each append with its own format; this
adapter resamples one whose rate differs from the session's, with one streaming
resampler per source rate so a stream of such appends keeps its filter state.
"""

from __future__ import annotations

from dataclasses import replace

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import StreamingResampler


class AppendRateAdapter:
    def __init__(self, session_rate: int) -> None:
        self.session_rate = session_rate
        self._resamplers: dict[int, StreamingResampler] = {}

    def configure(self, session_rate: int) -> None:
        if session_rate != self.session_rate:
            self.session_rate = session_rate
            self._resamplers.clear()

    def adapt(self, event: p.InputAudioBufferAppend) -> p.InputAudioBufferAppend:
        """``event`` at the session's rate (unchanged when it already is, or names no rate)."""
        rate = event.sample_rate_hz
        if rate is None or rate == self.session_rate:
            return replace(event, sample_rate_hz=None)
        resampler = self._resamplers.get(rate)
        if resampler is None:
            resampler = self._resamplers[rate] = StreamingResampler(rate, self.session_rate)
        return replace(event, audio=resampler.process(event.audio), sample_rate_hz=None)
