"""Recent latency figures of one call, for the page and for logs."""

from __future__ import annotations

from collections import deque

#: barge_in_ms: caller onset at input -> first silent output frame.
#: turn_ms: speech_stopped received -> first frame of the next response played.
#: input_added_ms: caller frame in -> its append handed to the conversation.
#: output_added_ms: first audio delta of a response received -> its first frame played.
FIGURES = ("barge_in_ms", "turn_ms", "input_added_ms", "output_added_ms")


class LatencyFigures:
    def __init__(self, keep: int = 50) -> None:
        self._recent: dict[str, deque[float]] = {name: deque(maxlen=keep) for name in FIGURES}

    def record(self, name: str, ms: float) -> None:
        self._recent[name].append(ms)

    def last(self, name: str) -> float | None:
        values = self._recent[name]
        return values[-1] if values else None

    def recent(self, name: str) -> list[float]:
        return list(self._recent[name])

    def snapshot(self) -> dict[str, dict[str, float | int | None]]:
        """{figure: {"last", "median", "count"}} rounded to 0.1 ms."""
        out: dict[str, dict[str, float | int | None]] = {}
        for name, values in self._recent.items():
            ordered = sorted(values)
            out[name] = {
                "last": round(values[-1], 1) if values else None,
                "median": round(ordered[len(ordered) // 2], 1) if ordered else None,
                "count": len(values),
            }
        return out
