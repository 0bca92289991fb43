"""Split streamed reply text into clauses as soon as they end, so speech can start early."""

from __future__ import annotations

import re

# A clause ends at a run of . ! ? ; : (plus closing quotes/brackets), at a comma, or at a
# line break, but only once whitespace follows: "3.5" or "10:30" are not ends.
_BOUNDARY = re.compile(r"(?P<stop>[.!?;:]+)[\"'”’)\]]*(?=\s)|(?P<comma>,)[\"'”’)\]]*(?=\s)|\n")
_MIN_WORDS_BEFORE_COMMA = 6
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e"}
)


class ClauseSplitter:
    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, delta: str) -> list[str]:
        """Add text; return the clauses completed by it (stripped, non-empty)."""
        self._buffer += delta
        clauses: list[str] = []
        search_from = 0
        while match := _BOUNDARY.search(self._buffer, search_from):
            head = self._buffer[: match.end()]
            if not self._is_end(match, head):
                search_from = match.end()
                continue
            clause = head.strip()
            if clause:
                clauses.append(clause)
            self._buffer = self._buffer[match.end() :].lstrip()
            search_from = 0
        return clauses

    def flush(self) -> str | None:
        """Return the unfinished remainder (None when empty) and start over."""
        rest, self._buffer = self._buffer.strip(), ""
        return rest or None

    @staticmethod
    def _is_end(match: re.Match[str], head: str) -> bool:
        if match.group("comma"):
            return len(head.split()) >= _MIN_WORDS_BEFORE_COMMA
        if match.group("stop") == ".":
            words = head[: match.start()].split()
            if words and words[-1].lower() in _ABBREVIATIONS:
                return False
        return True
