"""Recent latency figures of one call, for the page and for logs.

What each figure measures is defined once, in agent/metrics.py (FIGURE_DEFINITIONS).
"""

from __future__ import annotations

from collections import deque

from duplex_agent.agent.metrics import FIGURE_DEFINITIONS

FIGURES = tuple(FIGURE_DEFINITIONS)


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


class ArrivalClock:
    """When each stretch of a call's input arrived: input position (ms of caller audio since
    the call began) -> the perf_counter time of the frame that carried it."""

    def __init__(self, keep: int = 500) -> None:  # 10 s of 20 ms frames
        self._frames: deque[tuple[float, float]] = deque(maxlen=keep)  # (end ms, arrived at)
        self.position_ms = 0.0

    def add(self, duration_ms: float, arrived_at: float) -> None:
        self.position_ms += duration_ms
        self._frames.append((self.position_ms, arrived_at))

    def arrival_of(self, position_ms: float) -> float | None:
        """Arrival of the frame holding ``position_ms``; the newest frame's for a later one;
        None before any input."""
        for end_ms, arrived_at in self._frames:
            if end_ms > position_ms:
                return arrived_at
        return self._frames[-1][1] if self._frames else None
