"""Moshi's frames as duplex events: each frame's audio, its word piece as transcript, whole words as marks.

A frame's text is a word piece; a piece that starts with a space starts a word. The transcript
is the pieces joined as they come. Marks (which words span which audio, for the playback
ledger) are whole words: a word's mark goes out on the frame that ends it (the next word's
first frame, or the first padding frame) and reaches back over the frames it was spoken in,
so a cut inside a word keeps the word whole or drops it, never half of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from duplex_agent.plugins.contract.engine import StageOutput
from duplex_agent.plugins.moshi.model import SlotOutput
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane


@dataclass(slots=True)
class _Word:
    text: str
    #: Audio since the word's first frame began, up to the frame being projected.
    spoken_ms: float = 0.0


class MoshiDataPlane(SpeechDataPlane):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._words: dict[str, _Word] = {}  # request -> the word being spoken

    def close_stream(self, request_id: str) -> None:
        super().close_stream(request_id)
        self._words.pop(request_id, None)

    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
        assert isinstance(result, StageOutput)
        if result.finished:
            self.mark_terminal(result.request_id)
        frame = result.output
        if not isinstance(frame, SlotOutput):
            return []
        audio_ms = 1000.0 * frame.audio.size / self._sample_rate
        marks: list[dict[str, object]] = []
        word = self._words.get(result.request_id)
        if word is not None and (not frame.text or frame.text.startswith(" ")):
            marks.append({"text": word.text, "start_ms": -word.spoken_ms, "end_ms": 0.0})
            word = None
        if frame.text:
            word = _Word(frame.text) if word is None else _Word(word.text + frame.text, word.spoken_ms)
        if word is None:
            self._words.pop(result.request_id, None)
        else:
            word.spoken_ms += audio_ms
            self._words[result.request_id] = word
        events: list[dict[str, object]] = [
            {"type": "response.output_audio.delta", "delta": self._encode(frame.audio, self._sample_rate, "pcm16", None),
             "sample_rate": self._sample_rate, "audio_ms": audio_ms, "marks": marks},
        ]
        if frame.text:
            events.append({"type": "response.output_audio_transcript.delta", "delta": frame.text})
        return events
