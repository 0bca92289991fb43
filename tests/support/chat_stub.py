"""A real local OpenAI-compatible chat endpoint for tests: an aiohttp server on a loopback port whose
``POST /v1/chat/completions`` is the test's handler (streamed replies, errors, whatever it needs)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(obj: object) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj)}\n\n".encode()


def chunk(content: str) -> dict:
    """A chat-completion stream chunk whose delta says ``content``."""
    return {"choices": [{"index": 0, "delta": {"content": content}}]}


def streaming_reply(pieces: list[str], seen: list[dict] | None = None) -> Handler:
    """A handler that streams ``pieces`` as deltas, then ``[DONE]``; each request's JSON body goes to ``seen``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if seen is not None:
            seen.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(sse(chunk(piece)))
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


async def start_server(handler: Handler, *, models: Handler | None = None) -> tuple[web.AppRunner, str]:
    """The server, started on a free loopback port, and its base URL (``http://127.0.0.1:PORT/v1``);
    ``models`` answers ``GET /v1/models`` (else it is a 404, which is an answer too)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    if models is not None:
        app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"
