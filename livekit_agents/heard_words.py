"""Which words of a response the caller has heard, from the audio's text marks.

The same rule as the playback ledger (``text_heard_by``), word by word: a word is
heard once its share of its mark's audio has played. Each word gets its span on the
response's audio, interpolated inside its mark by characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from duplex_agent.agent.session.ledger import TextMark, text_heard_by

_WORD = re.compile(r"\S+")


@dataclass(frozen=True, slots=True)
class HeardWord:
    text: str
    #: Span on the response's own audio, in ms from its first sample.
    start_ms: float
    end_ms: float


class HeardWords:
    """Per response: its marks, and how many of its words have been handed on as heard."""

    def __init__(self) -> None:
        self._marks: dict[str, list[TextMark]] = {}
        self._words: dict[str, list[HeardWord]] = {}
        self._taken: dict[str, int] = {}

    def add_marks(self, response_id: str, marks: list[dict[str, Any]]) -> None:
        for mark in marks:
            text, start, end = str(mark["text"]), float(mark["start_ms"]), float(mark["end_ms"])
            self._marks.setdefault(response_id, []).append(TextMark(text, start, end))
            stripped = text.strip()
            offset = len(text) - len(text.lstrip())
            span = (end - start) / max(1, len(stripped))
            self._words.setdefault(response_id, []).extend(
                HeardWord(m.group(), start + span * (m.start() - offset), start + span * (m.end() - offset))
                for m in _WORD.finditer(text))

    def heard_text(self, response_id: str, played_ms: float) -> str:
        return text_heard_by(self._marks.get(response_id, []), played_ms)

    def take_heard(self, response_id: str, played_ms: float) -> list[HeardWord]:
        """The words heard by ``played_ms`` that were not taken before."""
        heard = len(self.heard_text(response_id, played_ms).split())
        taken = self._taken.get(response_id, 0)
        if heard <= taken:
            return []
        self._taken[response_id] = heard
        return self._words.get(response_id, [])[taken:heard]

    def take_rest(self, response_id: str) -> list[HeardWord]:
        """All the words not taken yet: the response played out to its end."""
        words = self._words.get(response_id, [])
        taken, self._taken[response_id] = self._taken.get(response_id, 0), len(words)
        return words[taken:]

    def forget(self, response_id: str) -> None:
        self._marks.pop(response_id, None)
        self._words.pop(response_id, None)
        self._taken.pop(response_id, None)
