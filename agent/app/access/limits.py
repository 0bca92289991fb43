"""Per client address: how many sessions it may open per minute and hold open at once.

State is kept only for addresses with recent or open sessions, and one address's
record is bounded by its rate, so a flood from one address costs a fixed amount of
memory however long it lasts.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0
#: Retry-After for a client at its open-session limit: sessions end on their own clock.
OPEN_LIMIT_RETRY_S = 10


class LimitExceeded(Exception):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Ticket:
    """One admitted session of one address; ``release`` (idempotent) frees its open slot."""

    def __init__(self, limits: AddressLimits, address: str) -> None:
        self._limits = limits
        self.address = address
        self._live: Callable[[], bool] | None = None
        self.released = False

    def hand_over(self, live: Callable[[], bool]) -> None:
        """The session outlives the request: it holds its slot while ``live()`` is true."""
        self._live = live

    def live(self) -> bool:
        if self.released:
            return False
        if self._live is not None and not self._live():
            self.release()
            return False
        return True

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._limits._forget(self)


class AddressLimits:
    def __init__(self, *, per_minute: int, open_per_address: int, clock=time.monotonic) -> None:
        self.per_minute = per_minute
        self.open_per_address = open_per_address
        self._clock = clock
        self._starts: dict[str, deque[float]] = {}
        self._open: dict[str, set[Ticket]] = {}

    def admit(self, address: str) -> Ticket:
        """A ticket for a new session from ``address``, or LimitExceeded (with Retry-After)."""
        now = self._clock()
        starts = self._starts.get(address)
        if starts is not None:
            while starts and starts[0] <= now - WINDOW_S:
                starts.popleft()
        if self.per_minute and starts is not None and len(starts) >= self.per_minute:
            retry = max(1, math.ceil(starts[0] + WINDOW_S - now))
            raise LimitExceeded(f"{address} opened {len(starts)} sessions in the last minute "
                                f"(limit {self.per_minute}); retry in {retry} s", retry)
        if self.open_per_address and self.open_count(address) >= self.open_per_address:
            raise LimitExceeded(f"{address} already holds {self.open_per_address} open sessions (the limit "
                                "per address); close one first", OPEN_LIMIT_RETRY_S)
        if self.per_minute:
            self._starts.setdefault(address, deque()).append(now)
        ticket = Ticket(self, address)
        self._open.setdefault(address, set()).add(ticket)
        return ticket

    def open_count(self, address: str) -> int:
        return sum(ticket.live() for ticket in list(self._open.get(address, ())))

    def _forget(self, ticket: Ticket) -> None:
        tickets = self._open.get(ticket.address)
        if tickets is not None:
            tickets.discard(ticket)
            if not tickets:
                del self._open[ticket.address]
        self.prune()

    def prune(self) -> None:
        """Drop the records of addresses with nothing recent and nothing open."""
        horizon = self._clock() - WINDOW_S
        for address in [a for a, starts in self._starts.items() if not starts or starts[-1] <= horizon]:
            del self._starts[address]

    def tracked_addresses(self) -> int:
        return len(self._starts.keys() | self._open.keys())
