"""An HTTP request's whole body, capped: the one way our handlers read a body.

``request.content.read(n)`` hands back only what has arrived so far, so a body
that comes in several TCP segments was read in part. ``read_whole_body`` reads
to the end of the body (Content-Length or chunked), whatever the segmentation,
and stops with ``BodyTooLarge`` as soon as the cap is passed.
"""

from __future__ import annotations

from aiohttp import web


class BodyTooLarge(Exception):
    """A body over the route's cap: answer 413 with ``code`` and this message."""

    status = 413
    code = "body_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request bodies are limited to {limit} bytes")
        self.limit = limit


async def read_whole_body(request: web.Request, limit: int) -> bytes:
    """All of ``request``'s body, at most ``limit`` bytes (``BodyTooLarge`` past it)."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        part = await request.content.read(limit + 1 - size)
        if not part:  # the end of the body
            return b"".join(parts)
        size += len(part)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(part)
