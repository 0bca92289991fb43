"""The page a person opens: static files served without a build step."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent
_FILES = {"/": "index.html", "/app.js": "app.js", "/style.css": "style.css"}


def _serve(name: str):
    path = STATIC_DIR / name

    async def handler(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    return handler


def register_frontend_routes(app: web.Application) -> None:
    """Serve the page at ``/`` and its script and style next to it."""
    for route, name in _FILES.items():
        app.router.add_get(route, _serve(name))
