"""How many more sessions the remote duplex server will take, as far as this worker can tell.

Three sources. Our own server publishes ``{"sessions", "max_sessions"}`` on
``/healthz``, which a probe reads every ``interval_s``. vLLM-Omni has no
``/healthz``; its ``/health`` says only whether the engine is alive (200, or 503
when it is dead: no free sessions). Beyond that a server is known by its
refusals: a ``resource_exhausted`` marks it full until one of our sessions on it
ends or ``refusal_hold_s`` passes. While a probe runs, sessions this worker claimed after it
last asked are taken off the published figure, so two calls placed within one probe interval
do not both count the same free session; with no probe running no claim is kept (none would
ever be dropped). Each probe also times the round trip. The figures are read from any
thread (a LiveKit worker's load function runs in an executor), so they are kept behind a lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import aiohttp
from yarl import URL

log = logging.getLogger("duplex_agent.remote")


def health_url(realtime_url: URL, path: str = "/healthz") -> URL:
    """``ws(s)://host:port/v1/realtime?...`` -> ``http(s)://host:port/healthz`` (or ``path``)."""
    scheme = {"ws": "http", "wss": "https"}.get(realtime_url.scheme, realtime_url.scheme)
    return realtime_url.with_scheme(scheme).with_path(path).with_query(None)


class ServerCapacity:
    def __init__(self, *, refusal_hold_s: float = 5.0) -> None:
        self.refusal_hold_s = refusal_hold_s
        self._lock = threading.Lock()
        self._published: int | None = None  # free sessions the server last published
        self._refused_at: float | None = None
        self._alive = True  # the last probe reached a live server (or none has run)
        self._rtt_s: float | None = None
        self._claims: list[float] = []  # when this worker claimed a session the last publication may not count
        self._probes = 0  # probes running: only they drop claims, so only then are claims kept

    @property
    def free_sessions(self) -> int | None:
        """Free sessions on the server; None when it is not known."""
        with self._lock:
            if not self._alive:
                return 0
            if self._refused_at is not None and time.monotonic() - self._refused_at < self.refusal_hold_s:
                return 0
            if self._published is None:
                return None
            return max(0, self._published - len(self._claims))

    @property
    def rtt_s(self) -> float | None:
        """The last probe's round trip (None before one answered)."""
        with self._lock:
            return self._rtt_s

    @property
    def alive(self) -> bool:
        with self._lock:
            return self._alive

    def refused(self) -> None:
        with self._lock:
            self._refused_at = time.monotonic()

    def claimed(self) -> None:
        """This worker is opening a session there: one fewer free until a probe asked later says otherwise."""
        with self._lock:
            if self._probes:
                self._claims.append(time.monotonic())

    def session_ended(self) -> None:
        with self._lock:
            self._refused_at = None

    def published(self, free: int | None, *, alive: bool = True, rtt_s: float | None = None,
                  asked_at: float | None = None) -> None:
        """A probe's reading; ``asked_at`` (monotonic): when it was asked, so claims before it are counted in it."""
        with self._lock:
            self._published = free
            asked_at = time.monotonic() if asked_at is None else asked_at
            self._claims = [t for t in self._claims if t >= asked_at]
            self._alive = alive
            if rtt_s is not None:
                self._rtt_s = rtt_s

    async def probe(self, realtime_url: URL, headers: dict[str, str], interval_s: float = 1.0) -> None:
        """Read the server's capacity (``/healthz``, else vLLM-Omni's ``/health``) and round trip until cancelled."""
        with self._lock:
            self._probes += 1
        try:
            await self._read(realtime_url, headers, interval_s)
        finally:
            with self._lock:
                self._probes -= 1

    async def _read(self, realtime_url: URL, headers: dict[str, str], interval_s: float) -> None:
        url = health_url(realtime_url)
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=interval_s * 2)) as http:
            while True:
                started = time.monotonic()
                try:
                    async with http.get(url) as response:
                        status = response.status
                        text = await response.text() if status == 200 else ""
                except (aiohttp.ClientError, OSError, TimeoutError):
                    self.published(None, asked_at=started)  # unreachable just now: unknown, not full (opens find out)
                else:
                    rtt_s = time.monotonic() - started
                    try:
                        data = json.loads(text)
                    except ValueError:
                        data = None
                    if isinstance(data, dict) and isinstance(data.get("sessions"), int) \
                            and isinstance(data.get("max_sessions"), int):
                        self.published(max(0, data["max_sessions"] - data["sessions"]), rtt_s=rtt_s, asked_at=started)
                    elif url.path == "/healthz" and status in (404, 405):
                        log.info("%s publishes no session capacity; reading vLLM-Omni's /health", url)
                        url = health_url(realtime_url, "/health")
                        continue
                    else:  # vLLM-Omni's /health: 200 healthy, 503 when its engine is dead
                        self.published(None, alive=status == 200, rtt_s=rtt_s, asked_at=started)
                await asyncio.sleep(interval_s)
