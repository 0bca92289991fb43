"""How many more sessions the remote duplex server will take, as far as this worker can tell.

Two sources. Our own server publishes ``{"sessions", "max_sessions"}`` on
``/healthz``, which a probe reads every ``interval_s``. A server that does not
(vLLM-Omni) is known only by its refusals: a ``resource_exhausted`` marks it
full until one of our sessions on it ends or ``refusal_hold_s`` passes. The
figure is read from any thread (a LiveKit worker's load function runs in an
executor), so it is kept behind a lock.
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


def health_url(realtime_url: URL) -> URL:
    """``ws(s)://host:port/v1/realtime?...`` -> ``http(s)://host:port/healthz``."""
    scheme = {"ws": "http", "wss": "https"}.get(realtime_url.scheme, realtime_url.scheme)
    return realtime_url.with_scheme(scheme).with_path("/healthz").with_query(None)


class ServerCapacity:
    def __init__(self, *, refusal_hold_s: float = 5.0) -> None:
        self.refusal_hold_s = refusal_hold_s
        self._lock = threading.Lock()
        self._published: int | None = None  # free sessions the server last published
        self._refused_at: float | None = None

    @property
    def free_sessions(self) -> int | None:
        """Free sessions on the server; None when it is not known."""
        with self._lock:
            if self._refused_at is not None and time.monotonic() - self._refused_at < self.refusal_hold_s:
                return 0
            return self._published

    def refused(self) -> None:
        with self._lock:
            self._refused_at = time.monotonic()

    def session_ended(self) -> None:
        with self._lock:
            self._refused_at = None

    def published(self, free: int | None) -> None:
        with self._lock:
            self._published = free

    async def probe(self, url: URL, headers: dict[str, str], interval_s: float = 1.0) -> None:
        """Read the server's published capacity until cancelled; stops if it publishes none."""
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=interval_s * 2)) as http:
            while True:
                try:
                    async with http.get(url) as response:
                        text = await response.text() if response.status == 200 else ""
                except (aiohttp.ClientError, OSError, TimeoutError):
                    self.published(None)  # unreachable just now: unknown, not full
                else:
                    try:
                        data = json.loads(text)
                    except ValueError:
                        data = None
                    if not (isinstance(data, dict) and isinstance(data.get("sessions"), int)
                            and isinstance(data.get("max_sessions"), int)):
                        log.info("%s publishes no session capacity; going by refusals", url)
                        self.published(None)
                        return
                    self.published(max(0, data["max_sessions"] - data["sessions"]))
                await asyncio.sleep(interval_s)
