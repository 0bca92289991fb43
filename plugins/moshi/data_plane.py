"""Moshi's frames as duplex events: each frame's audio with the text it spoke as a mark.

A frame's text is a word piece that carries its own leading space, so the transcript is the
pieces joined as they come; frames whose text token is padding carry audio and no mark.
"""

from __future__ import annotations

from collections.abc import Iterable

from duplex_agent.plugins.contract.engine import StageOutput
from duplex_agent.plugins.moshi.model import SlotOutput
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane


class MoshiDataPlane(SpeechDataPlane):
    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
        assert isinstance(result, StageOutput)
        if result.finished:
            self.mark_terminal(result.request_id)
        frame = result.output
        if not isinstance(frame, SlotOutput):
            return []
        audio_ms = 1000.0 * frame.audio.size / self._sample_rate
        marks = [{"text": frame.text, "start_ms": 0.0, "end_ms": audio_ms}] if frame.text else []
        events: list[dict[str, object]] = [
            {"type": "response.output_audio.delta", "delta": self._encode(frame.audio, self._sample_rate, "pcm16", None),
             "sample_rate": self._sample_rate, "audio_ms": audio_ms, "marks": marks},
        ]
        if frame.text:
            events.append({"type": "response.output_audio_transcript.delta", "delta": frame.text})
        return events
