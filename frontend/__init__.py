"""The page a person opens: static files served without a build step.

The LiveKit mode needs livekit-client's prebuilt browser bundle. It is not
committed: ``make install`` runs ``npm ci --prefix frontend`` (the version pinned in
``frontend/package-lock.json``) and copies the bundle to ``frontend/vendor/``,
which the wheel carries as package data. The page loads it from
``/vendor/livekit-client.umd.js``. Without it the Direct mode works and the
LiveKit mode says what to run.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent
_FILES = {"/": "index.html", "/app.js": "app.js", "/style.css": "style.css",
          "/favicon.svg": "favicon.svg", "/favicon.ico": "favicon.svg"}  # browsers ask for /favicon.ico
LIVEKIT_CLIENT_ROUTE = "/vendor/livekit-client.umd.js"
LIVEKIT_CLIENT_CANDIDATES = (
    STATIC_DIR / "vendor" / "livekit-client.umd.js",
    STATIC_DIR / "node_modules" / "livekit-client" / "dist" / "livekit-client.umd.js",
)


def livekit_client_path() -> Path | None:
    """Where livekit-client's browser bundle is on this machine, or None."""
    for path in LIVEKIT_CLIENT_CANDIDATES:
        if path.is_file():
            return path
    return None


def _serve(name: str):
    path = STATIC_DIR / name

    async def handler(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    return handler


async def _livekit_client(_request: web.Request) -> web.StreamResponse:
    path = livekit_client_path()
    if path is None:
        return web.Response(status=404, text="livekit-client is not installed: run `npm ci --prefix frontend`\n")
    return web.FileResponse(path, headers={"Cache-Control": "no-cache", "Content-Type": "text/javascript"})


def register_frontend_routes(app: web.Application) -> None:
    """Serve the page at ``/``, its script and style, and the LiveKit client bundle."""
    for route, name in _FILES.items():
        app.router.add_get(route, _serve(name))
    app.router.add_get(LIVEKIT_CLIENT_ROUTE, _livekit_client)
