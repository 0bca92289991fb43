"""The worker's one HTTP server: page, WebRTC signaling, realtime websocket, health, metrics.

Access control (key and tokens, origins, per-address limits) sits in front of every
route as one middleware (agent/app/access/guard.py); TLS and the optional metrics
port are set up by ``start_http``.
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

from aiohttp import web

from duplex_agent.agent import metrics
from duplex_agent.agent.app.access.certificates import (
    ServerCertificate,
    machine_addresses,
    server_certificate,
    what_the_phone_shows,
)
from duplex_agent.agent.app.access.guard import install_access_control
from duplex_agent.agent.app.realtime_ws import RealtimeEndpoint
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.process_figures import watch_loop
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.ports import DuplexBackend

if TYPE_CHECKING:
    from duplex_agent.agent.tools.toolbox import ToolBox

log = logging.getLogger("duplex_agent")
BACKEND_KEY = web.AppKey("backend", object)
SETTINGS_KEY = web.AppKey("settings", Settings)


def build_app(
    backend: DuplexBackend,
    settings: Settings,
    *,
    with_webrtc: bool = True,
    config_timeout_s: float = 10.0,
    mint_livekit_tokens: bool = False,
    tools: ToolBox | None = None,
    cpu_guard: CpuGuard | None = None,
) -> web.Application:
    """The worker's routes. ``mint_livekit_tokens`` (dev mode only) lets the page ask for
    room tokens signed with the worker's LiveKit credentials. ``tools`` serve the direct WebRTC
    callers (a realtime websocket client runs its own). ``cpu_guard`` refuses new direct calls
    and websocket sessions while the machine is saturated."""
    app = web.Application(client_max_size=64 * 1024)
    app[BACKEND_KEY] = backend
    app[SETTINGS_KEY] = settings

    add_health_routes(app, backend)
    RealtimeEndpoint(backend, config_timeout_s=config_timeout_s, resume_grace_s=settings.resume_grace_s,
                     cpu_guard=cpu_guard).register(app)
    peer_sessions = None
    if with_webrtc:
        from duplex_agent.frontend import register_frontend_routes
        from duplex_agent.webrtc.direct.host_address import interface_ipv4
        from duplex_agent.webrtc.direct.signaling import register_webrtc_routes
        from duplex_agent.webrtc.livekit.tokens import register_livekit_token_routes

        registry = register_webrtc_routes(app, backend, host_address=settings.ice_address or interface_ipv4(),
                                          resume_grace_s=settings.resume_grace_s, opus_bitrate=settings.opus_bitrate,
                                          media_timeout_s=settings.media_timeout, tools=tools,
                                          echo_cancel=settings.echo_cancel, cpu_guard=cpu_guard)
        peer_sessions = lambda: registry.sessions  # noqa: E731
        register_frontend_routes(app)
        minting = mint_livekit_tokens and settings.livekit_api_key and settings.livekit_api_secret
        register_livekit_token_routes(
            app,
            url=settings.livekit_url if minting else "",
            api_key=settings.livekit_api_key if minting else "",
            api_secret=settings.livekit_api_secret if minting else "",
            agent_name=settings.agent_name,
        )
    install_access_control(app, api_key=settings.resolved_api_key(), token_ttl_s=settings.token_ttl,
                           allowed_origins=settings.allowed_origins, sessions_per_minute=settings.sessions_per_minute,
                           sessions_per_address=settings.sessions_per_address, metrics_port=settings.metrics_port,
                           peer_sessions=peer_sessions)
    return app


def build_metrics_app(backend: DuplexBackend) -> web.Application:
    """Only /metrics and /healthz: a LiveKit worker's, which serves no page."""
    app = web.Application(client_max_size=1024)
    add_health_routes(app, backend)
    return app


def add_health_routes(app: web.Application, backend: DuplexBackend) -> None:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": backend.active_sessions,
                                  "max_sessions": backend.capabilities.max_sessions})

    async def metrics_page(request: web.Request) -> web.Response:
        metrics.ACTIVE_SESSIONS.labels("all").set(backend.active_sessions)
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)


def tls_certificate(settings: Settings) -> ServerCertificate | None:
    """The certificate the settings ask for (made now for --tls-self-signed), or None for plain HTTP."""
    if not settings.tls_enabled:
        return None
    certificate, made = server_certificate(settings.tls_cert, settings.tls_key, settings.tls_self_signed,
                                           settings.tls_dir)
    if made:
        log.info("made a self-signed certificate for %s", ", ".join(certificate.names()))
    return certificate


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context from the settings (None: plain HTTP); for a self-signed
    certificate, prints its fingerprint and what a phone will show. ValueError says what is wrong."""
    try:
        certificate = tls_certificate(settings)
        if certificate is None:
            return None
        context = certificate.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use the TLS certificate: {exc}") from None
    if certificate.self_signed:
        host, port = settings.host, settings.port
        hosts = [host] if host not in ("0.0.0.0", "::", "") else [a for a in machine_addresses() if ":" not in a]
        print(what_the_phone_shows(certificate, [f"https://{h}:{port}/" for h in hosts]), flush=True)
    return context


async def start_http(app: web.Application, host: str, port: int, *,
                     ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve ``app`` on host:port; the caller cleans the returned runner up.

    Without ``ssl_context``, TLS follows the app's settings (--tls-cert/--tls-key or
    --tls-self-signed); with --metrics-port, /metrics and /healthz are served there only.
    """
    settings = app.get(SETTINGS_KEY)
    if ssl_context is None and settings is not None:
        ssl_context = tls_context(settings)
    watch_loop()  # the loop that serves calls: its tasks on /metrics
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    if settings is not None and settings.metrics_port:
        await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
    return runner
