"""The worker's one HTTP server: page, WebRTC signaling, realtime websocket, health, metrics."""

from __future__ import annotations

from aiohttp import web

from duplex_agent.agent import metrics
from duplex_agent.agent.app.realtime_ws import RealtimeEndpoint
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.session.ports import DuplexBackend

BACKEND_KEY = web.AppKey("backend", object)


def build_app(
    backend: DuplexBackend,
    settings: Settings,
    *,
    with_webrtc: bool = True,
    config_timeout_s: float = 10.0,
    mint_livekit_tokens: bool = False,
) -> web.Application:
    """The worker's routes. ``mint_livekit_tokens`` (dev mode only) lets the page ask for
    room tokens signed with the worker's LiveKit credentials."""
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
        from duplex_agent.frontend import register_frontend_routes
        from duplex_agent.webrtc.direct.host_address import interface_ipv4
        from duplex_agent.webrtc.direct.signaling import register_webrtc_routes
        from duplex_agent.webrtc.livekit.tokens import register_livekit_token_routes

        register_webrtc_routes(app, backend, host_address=settings.ice_address or interface_ipv4(),
                               opus_bitrate=settings.opus_bitrate)
        register_frontend_routes(app)
        minting = mint_livekit_tokens and settings.livekit_api_key and settings.livekit_api_secret
        register_livekit_token_routes(
            app,
            url=settings.livekit_url if minting else "",
            api_key=settings.livekit_api_key if minting else "",
            api_secret=settings.livekit_api_secret if minting else "",
            agent_name=settings.agent_name,
        )
    return app


async def start_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on host:port; the caller cleans the returned runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
