"""The userspace link between two TUN devices: one thread reads IPv4 packets from
either side, lets each direction's Impairer decide each UDP packet's fate, holds
delayed packets in a time-ordered heap, and writes them to the other side.

Only UDP is impaired (the call's media, RTCP and data channel all ride UDP); other
IPv4 traffic (the HTTP offer over TCP) passes at once, untouched. Anything that is
not IPv4 (the kernel's IPv6 chatter on a new device) is not forwarded.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import select
import threading
import time

from devtools.netem.impairments import DirectionCounts, Impairer, Impairment

UDP = 17
#: The two directions, named for where the packets go.
TO_WORKER, TO_CALLER = "to_worker", "to_caller"


class Forwarder:
    """Forwards between ``caller_fd`` and ``worker_fd`` on its own thread until ``stop()``."""

    def __init__(self, caller_fd: int, worker_fd: int, to_worker: Impairment, to_caller: Impairment,
                 seed: int) -> None:
        self._fds = {TO_WORKER: (caller_fd, worker_fd), TO_CALLER: (worker_fd, caller_fd)}
        self._impairers = {TO_WORKER: Impairer(to_worker, seed), TO_CALLER: Impairer(to_caller, seed + 1)}
        self._lock = threading.Lock()
        self._blackout_until = 0.0
        self._held: list[tuple[float, int, str, bytes]] = []  # (release at, arrival number, direction, packet)
        self._arrivals = 0
        self._latest_delivered = {TO_WORKER: -1, TO_CALLER: -1}
        self._last_udp_delivered_at = {TO_WORKER: 0.0, TO_CALLER: 0.0}
        self._blackout_drops: dict[str, list[float]] = {}  # direction: [first, last] drop of the last blackout
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="netem-forwarder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def set_impairment(self, direction: str, impairment: Impairment) -> None:
        """Change one direction's impairments from now on (its counts carry on)."""
        with self._lock:
            self._impairers[direction].impairment = impairment

    def blackout(self, seconds: float) -> None:
        """Drop every UDP packet, both ways, for the next ``seconds``."""
        with self._lock:
            self._blackout_until = time.monotonic() + seconds
            self._blackout_drops = {}

    def blackout_drop_span(self, direction: str) -> float:
        """Seconds from the first to the last UDP packet the last blackout dropped in ``direction``."""
        with self._lock:
            first, last = self._blackout_drops.get(direction, (0.0, 0.0))
            return last - first

    def flowing_again(self, *directions: str) -> bool:
        """True once UDP has been delivered in ``directions`` (default: both) since the last blackout ended."""
        with self._lock:
            return all(self._last_udp_delivered_at[d] > self._blackout_until for d in directions or self._fds)

    def reset_counts(self) -> None:
        """Start every direction's counts from zero."""
        with self._lock:
            for impairer in self._impairers.values():
                impairer.counts = DirectionCounts()

    def counts(self) -> dict[str, DirectionCounts]:
        """A copy of each direction's counts."""
        with self._lock:
            return {d: DirectionCounts(**{k: v for k, v in vars(i.counts).items()})
                    for d, i in self._impairers.items()}

    def _run(self) -> None:
        by_fd = {src: direction for direction, (src, _) in self._fds.items()}
        readable = [*by_fd, self._wake_r]
        while not self._stopping:
            timeout = max(0.0, self._held[0][0] - time.monotonic()) if self._held else None
            ready, _, _ = select.select(readable, [], [], timeout)
            for fd in ready:
                if fd == self._wake_r:
                    continue
                try:
                    packet = os.read(fd, 65535)
                except OSError:
                    continue
                self._arrive(by_fd[fd], packet)
            now = time.monotonic()
            while self._held and self._held[0][0] <= now:
                _, arrival, direction, packet = heapq.heappop(self._held)
                self._deliver(direction, packet, arrival)

    def _arrive(self, direction: str, packet: bytes) -> None:
        if not packet or packet[0] >> 4 != 4:
            return
        self._arrivals += 1
        with self._lock:
            impairer = self._impairers[direction]
            if packet[9] != UDP:
                impairer.counts.other_in += 1
                delay: float | None = 0.0
            else:
                now = time.monotonic()
                blackout = now < self._blackout_until
                delay = impairer.delay_for_next(blackout)
                if blackout:
                    self._blackout_drops.setdefault(direction, [now, now])[1] = now
        if delay is None:
            return
        if delay > 0:
            heapq.heappush(self._held, (time.monotonic() + delay, self._arrivals, direction, packet))
        else:
            self._deliver(direction, packet, self._arrivals)

    def _deliver(self, direction: str, packet: bytes, arrival: int) -> None:
        if packet[9] == UDP:
            with self._lock:
                counts = self._impairers[direction].counts
                counts.delivered += 1
                if arrival < self._latest_delivered[direction]:
                    counts.reordered += 1
                self._latest_delivered[direction] = max(self._latest_delivered[direction], arrival)
                self._last_udp_delivered_at[direction] = time.monotonic()
        with contextlib.suppress(OSError):  # the other side's device is going away
            os.write(self._fds[direction][1], packet)
