"""The worker's one HTTP server: page, WebRTC signaling, realtime websocket, health, metrics."""

from __future__ import annotations

from aiohttp import web

from agent import metrics
from agent.backend import DuplexBackend
from agent.realtime_ws import RealtimeEndpoint
from agent.settings import Settings

BACKEND_KEY = web.AppKey("backend", object)


def build_app(
    backend: DuplexBackend, settings: Settings, *, with_webrtc: bool = True, config_timeout_s: float = 10.0
) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[BACKEND_KEY] = backend

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": backend.active_sessions,
                                  "max_sessions": backend.capabilities.max_sessions})

    async def metrics_page(request: web.Request) -> web.Response:
        metrics.ACTIVE_SESSIONS.labels("all").set(backend.active_sessions)
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)
    RealtimeEndpoint(backend, config_timeout_s=config_timeout_s).register(app)
    if with_webrtc:
        from frontend import register_frontend_routes
        from webrtc.host_address import interface_ipv4
        from webrtc.signaling import register_webrtc_routes

        register_webrtc_routes(app, backend, host_address=settings.ice_address or interface_ipv4())
        register_frontend_routes(app)
    return app
