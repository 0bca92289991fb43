"""Which web pages may drive the worker: the page's own origin, plus an allow-list.

Browsers send ``Origin`` on websocket handshakes and on cross-origin fetches, and a
page cannot forge it. A request without ``Origin`` comes from a program, not a page,
and is let through (credentials still apply). Same-origin compares the Origin's
host[:port] with the request's ``Host`` header, as the browser wrote both, so it
holds behind a TLS-terminating proxy that forwards ``Host``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web


class OriginRejected(Exception):
    """A page from an origin that is not allowed; ``str()`` is the reason."""


def _normalise(origin: str) -> str:
    parts = urlsplit(origin.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


class OriginPolicy:
    def __init__(self, allowed: str = "") -> None:
        entries = [entry.strip() for entry in allowed.split(",") if entry.strip()]
        self.any = "*" in entries
        self.allowed = frozenset(_normalise(entry) for entry in entries if entry != "*")

    def check(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None or self.any:
            return
        if origin == "null":
            raise OriginRejected("pages with an opaque origin (file:, sandboxed frames) may not connect")
        if urlsplit(origin).netloc.lower() == request.host.lower() or _normalise(origin) in self.allowed:
            return
        raise OriginRejected(f"pages from {origin} may not use this worker; add the origin to "
                             "--allowed-origins (DUPLEX_ALLOWED_ORIGINS) to allow it")
