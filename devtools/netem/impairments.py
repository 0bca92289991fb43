"""What a direction of the link does to each UDP packet: loss (random, Gilbert-Elliott
bursts, a blackout) and delay with jitter (which reorders), decided from a seeded RNG."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GilbertElliott:
    """Two-state burst loss: from good to bad with ``p`` per packet, back with ``r``;
    ``loss_bad`` / ``loss_good`` are the loss rates in each state. The long-run share
    of packets in the bad state is p / (p + r); a burst lasts 1 / r packets on average.
    ``max_bad`` (if set) ends a stay in the bad state after that many packets."""

    p: float
    r: float
    loss_bad: float = 1.0
    loss_good: float = 0.0
    max_bad: int | None = None

    @property
    def expected_loss(self) -> float:
        bad = self.p / (self.p + self.r)
        return bad * self.loss_bad + (1 - bad) * self.loss_good


@dataclass(frozen=True)
class Impairment:
    """One direction's impairments. Delay per packet is ``delay_ms`` plus a uniform draw in
    ±``jitter_ms`` (never below zero), so a packet can overtake the one sent before it."""

    loss: float = 0.0
    bursts: GilbertElliott | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def describe(self) -> str:
        parts = []
        if self.loss:
            parts.append(f"{100 * self.loss:g} % random loss")
        if self.bursts:
            parts.append(f"bursts (p={self.bursts.p:g}, r={self.bursts.r:g}, ~{100 * self.bursts.expected_loss:.1f} %)")
        if self.delay_ms or self.jitter_ms:
            parts.append(f"{self.delay_ms:g}±{self.jitter_ms:g} ms")
        return ", ".join(parts) or "clean"


CLEAN = Impairment()


@dataclass
class DirectionCounts:
    """What really happened to one direction's UDP packets."""

    udp_in: int = 0
    dropped_random: int = 0
    dropped_burst: int = 0
    dropped_blackout: int = 0
    delivered: int = 0
    delayed: int = 0
    reordered: int = 0  # delivered after a packet that arrived later than it
    longest_loss_run: int = 0
    other_in: int = 0  # non-UDP IPv4 (signaling over TCP): passed on at once, untouched
    _run: int = field(default=0, repr=False)

    @property
    def dropped(self) -> int:
        return self.dropped_random + self.dropped_burst + self.dropped_blackout

    def as_dict(self) -> dict[str, int]:
        return {"udp_in": self.udp_in, "dropped": self.dropped, "dropped_random": self.dropped_random,
                "dropped_burst": self.dropped_burst, "dropped_blackout": self.dropped_blackout,
                "delivered": self.delivered, "delayed": self.delayed, "reordered": self.reordered,
                "longest_loss_run": self.longest_loss_run, "other_in": self.other_in}


class Impairer:
    """Decides each UDP packet's fate for one direction and counts it."""

    def __init__(self, impairment: Impairment, seed: int) -> None:
        self.impairment = impairment
        self.counts = DirectionCounts()
        self._rng = random.Random(seed)
        self._bad = False
        self._bad_for = 0  # packets in the bad state so far in this stay

    def delay_for_next(self, blackout: bool) -> float | None:
        """Seconds to hold the next UDP packet, or None to drop it."""
        imp, counts, rng = self.impairment, self.counts, self._rng
        counts.udp_in += 1
        dropped = None
        if imp.bursts:
            ge = imp.bursts
            self._bad = (rng.random() >= ge.r) if self._bad else (rng.random() < ge.p)
            self._bad_for = self._bad_for + 1 if self._bad else 0
            if ge.max_bad is not None and self._bad_for > ge.max_bad:
                self._bad, self._bad_for = False, 0
            if rng.random() < (ge.loss_bad if self._bad else ge.loss_good):
                dropped = "burst"
        if dropped is None and imp.loss and rng.random() < imp.loss:
            dropped = "random"
        if blackout:
            dropped = "blackout"
        if dropped is not None:
            setattr(counts, f"dropped_{dropped}", getattr(counts, f"dropped_{dropped}") + 1)
            counts._run += 1
            counts.longest_loss_run = max(counts.longest_loss_run, counts._run)
            return None
        counts._run = 0
        delay_ms = imp.delay_ms + (rng.uniform(-imp.jitter_ms, imp.jitter_ms) if imp.jitter_ms else 0.0)
        delay_ms = max(0.0, delay_ms)
        if delay_ms > 0:
            counts.delayed += 1
        return delay_ms / 1000.0
