"""The playback ledger: what the agent said, sent and the caller actually heard.

Per response it counts generated, sent, played and committed milliseconds of
audio, and keeps text marks (which words span which audio) so that history
can be cut to what was heard, interpolated inside a mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TextMark:
    text: str
    start_ms: float
    end_ms: float


@dataclass(slots=True)
class ResponseLedger:
    response_id: str
    item_id: str
    generated_ms: float = 0.0
    sent_ms: float = 0.0
    played_ms: float = 0.0
    #: Set when playback was cut short; history keeps text up to here.
    committed_ms: float | None = None
    acked: bool = False
    marks: list[TextMark] = field(default_factory=list)
    transcript: str = ""

    def record_audio(self, duration_ms: float, marks: list[TextMark]) -> float:
        """Count a chunk of generated and sent audio; returns where it starts."""
        start = self.generated_ms
        self.generated_ms += duration_ms
        self.sent_ms = self.generated_ms
        self.marks.extend(TextMark(m.text, m.start_ms + start, m.end_ms + start) for m in marks)
        return start

    def record_text(self, delta: str) -> None:
        self.transcript += delta

    def acknowledge(self, played_ms: float) -> None:
        self.played_ms = min(max(0.0, played_ms), self.sent_ms)
        self.acked = True
        if self.committed_ms is not None:
            self.committed_ms = self.played_ms

    def interrupt(self) -> None:
        """Playback stopped early: history keeps what was acknowledged as played.

        A client that never acknowledges is taken to have heard all it was sent.
        """
        self.committed_ms = self.played_ms if self.acked else self.sent_ms

    @property
    def unplayed_ms(self) -> float:
        return max(0.0, self.sent_ms - self.played_ms) if self.acked else self.sent_ms

    def heard_text(self) -> str:
        """The assistant's words the caller heard (all of them unless interrupted)."""
        if self.committed_ms is None:
            return self.full_text()
        return text_heard_by(self.marks, self.committed_ms)

    def full_text(self) -> str:
        if self.marks:
            return " ".join(m.text.strip() for m in self.marks if m.text.strip())
        return self.transcript.strip()


def text_heard_by(marks: list[TextMark], at_ms: float) -> str:
    """Words spoken before ``at_ms``; inside a mark, the share of its characters
    proportional to the elapsed share of its audio, cut back to a whole word."""
    words: list[str] = []
    for mark in marks:
        text = mark.text.strip()
        if not text:
            continue
        if mark.end_ms <= at_ms:
            words.append(text)
            continue
        if mark.start_ms < at_ms and mark.end_ms > mark.start_ms:
            share = (at_ms - mark.start_ms) / (mark.end_ms - mark.start_ms)
            cut = int(len(text) * share)
            partial = text[:cut]
            if cut < len(text) and not text[cut].isspace():
                partial = partial.rsplit(" ", 1)[0] if " " in partial else ""
            if partial.strip():
                words.append(partial.strip())
        break
    return " ".join(words)
