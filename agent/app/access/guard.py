"""One middleware in front of every route: origin, then credentials, then per-address limits.

Everything is decided before the route's handler runs, so a refused request never
opens a session, starts a task or touches a model. Routes:

- session routes (``/v1/realtime``, ``/api/offer``, ``/api/livekit/token``): an allowed
  origin, and the key or a live session token when a key is set;
- ``POST /api/token`` mints session tokens: an allowed origin and the key itself;
- ``/metrics`` and ``/healthz``: the key when one is set, or only on the metrics port;
- everything else (the page, its script, ``GET /api/access``) is public: it holds no secrets.

New sessions (a websocket upgrade on ``/v1/realtime``, ``POST /api/offer``) also take a
slot from the client address's limits; a websocket holds it while its handler runs,
a WebRTC peer while it is in the signaling registry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict

from duplex_agent.agent.app.access.credentials import (
    SUBPROTOCOL_PREFIX,
    AccessDenied,
    AccessKeys,
    offered_subprotocols,
    presented_credential,
)
from duplex_agent.agent.app.access.limits import AddressLimits, LimitExceeded, Ticket
from duplex_agent.agent.app.access.origins import OriginPolicy, OriginRejected
from duplex_agent.agent.protocol.request_body import BodyTooLarge, read_whole_body

log = logging.getLogger("duplex_agent.access")

SESSION_PATHS = frozenset({"/v1/realtime", "/api/offer", "/api/livekit/token"})
TOKEN_PATH = "/api/token"
OPS_PATHS = frozenset({"/metrics", "/healthz"})
#: The subprotocol echoed to browsers that offer it (OpenAI's realtime clients do).
REALTIME_SUBPROTOCOL = "realtime"
MAX_TOKEN_BODY_BYTES = 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ECHO_PROTOCOL = web.RequestKey("echo_protocol", str)


def _refuse(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def _is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


class AccessGuard:
    """``api_key`` empty: no credentials needed; ``metrics_port`` 0: /metrics and /healthz on the main port."""

    def __init__(self, *, api_key: str = "", token_ttl_s: float = 300.0, allowed_origins: str = "",
                 sessions_per_minute: int = 0, sessions_per_address: int = 0, metrics_port: int = 0,
                 peer_sessions: Callable[[], dict] | None = None) -> None:
        self.keys = AccessKeys(api_key, token_ttl_s=token_ttl_s) if api_key else None
        self.origins = OriginPolicy(allowed_origins)
        self.limits = AddressLimits(per_minute=sessions_per_minute, open_per_address=sessions_per_address)
        self.metrics_port = metrics_port
        self._peer_sessions = peer_sessions or dict
        self._peer_tickets: dict[str, Ticket] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if self.metrics_port:
            on_metrics_port = _local_port(request) == self.metrics_port
            if on_metrics_port != (path in OPS_PATHS):
                raise web.HTTPNotFound()
            if on_metrics_port:
                return await handler(request)
        if path in OPS_PATHS:
            return await self._authorised(request, handler, key_only=True)
        if path == TOKEN_PATH or path in SESSION_PATHS:
            try:
                self.origins.check(request)
            except OriginRejected as exc:
                log.info("refused %s %s from %s: %s", request.method, path, request.remote, exc)
                return _refuse(403, "origin_not_allowed", str(exc))
            if path == TOKEN_PATH:
                return await self._authorised(request, handler, key_only=True)
            return await self._authorised(request, handler, key_only=False)
        return await handler(request)

    async def _authorised(self, request: web.Request, handler: Handler, *, key_only: bool) -> web.StreamResponse:
        if self.keys is not None:
            try:
                self.keys.check(presented_credential(request), key_only=key_only)
            except AccessDenied as exc:
                log.info("refused %s %s from %s: %s", request.method, request.path, request.remote, exc)
                return _refuse(401, "unauthorized", str(exc), **{"WWW-Authenticate": 'Bearer realm="duplex-agent"'})
        if request.path == "/v1/realtime" and _is_websocket(request):
            return await self._websocket_session(request, handler)
        if request.path == "/api/offer" and request.method == "POST":
            return await self._peer_session(request, handler)
        return await handler(request)

    def _admit(self, request: web.Request) -> Ticket:
        return self.limits.admit(request.remote or "unknown")

    async def _websocket_session(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            ticket = self._admit(request)
        except LimitExceeded as exc:
            return _refuse(429, "rate_limited", str(exc), **{"Retry-After": str(exc.retry_after_s)})
        try:
            return await handler(_without_subprotocols(request))
        finally:
            ticket.release()

    async def _peer_session(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            ticket = self._admit(request)
        except LimitExceeded as exc:
            return _refuse(429, "rate_limited", str(exc), **{"Retry-After": str(exc.retry_after_s)})
        try:
            response = await handler(request)
        except BaseException:
            ticket.release()
            raise
        pc_id = _answered_pc_id(response)
        held = self._peer_tickets.get(pc_id) if pc_id else None
        if pc_id is None or (held is not None and held.live()):  # refused, or a renegotiation
            ticket.release()
            return response
        for known in [k for k, t in self._peer_tickets.items() if not t.live()]:
            del self._peer_tickets[known]
        ticket.hand_over(lambda: pc_id in self._peer_sessions())
        self._peer_tickets[pc_id] = ticket
        return response

    # ---- routes of our own ----

    async def mint_token(self, request: web.Request) -> web.Response:
        """``POST /api/token`` (key only) ``{"ttl_s"?}`` -> ``{"token", "expires_at", "ttl_s"}``."""
        if self.keys is None:
            return _refuse(404, "no_api_key", "this worker has no API key, so it needs no tokens")
        try:
            raw = await read_whole_body(request, MAX_TOKEN_BODY_BYTES)
        except BodyTooLarge as exc:
            return _refuse(exc.status, exc.code, str(exc))
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError):
            return _refuse(400, "invalid_json", "the body must be a JSON object {\"ttl_s\"?: number}")
        ttl = body.get("ttl_s") if isinstance(body, dict) else None
        if not isinstance(body, dict) or (ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float))):
            return _refuse(400, "invalid_json", "the body must be a JSON object {\"ttl_s\"?: number}")
        try:
            token, expires = self.keys.mint(ttl)
        except ValueError as exc:
            return _refuse(400, "invalid_ttl", str(exc))
        return web.json_response({"token": token, "expires_at": expires,
                                  "ttl_s": ttl if ttl is not None else self.keys.token_ttl_s},
                                 headers={"Cache-Control": "no-store"})

    async def describe(self, _request: web.Request) -> web.Response:
        """``GET /api/access``: what the page needs to know before it connects (no secrets)."""
        return web.json_response({"key_required": self.keys is not None}, headers={"Cache-Control": "no-store"})


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return sockname[1] if sockname else None


def _answered_pc_id(response: web.StreamResponse) -> str | None:
    body = response.body if isinstance(response, web.Response) else None
    if response.status != 200 or not isinstance(body, bytes | bytearray):  # None, or a streamed Payload
        return None
    try:
        pc_id = json.loads(body).get("pc_id")
    except (ValueError, TypeError, AttributeError):
        return None
    return pc_id if isinstance(pc_id, str) else None


def _without_subprotocols(request: web.Request) -> web.Request:
    """The request without its subprotocols, remembering which one to echo.

    aiohttp logs a client's subprotocols when none match the handler's, and a credential
    rides in one: the handler must not see them. Browsers fail a handshake that offered
    subprotocols and got none back, so ``_echo_subprotocol`` answers ``realtime`` when it
    was offered, else the first one offered.
    """
    offered = offered_subprotocols(request)
    if not offered:
        return request
    plain = [p for p in offered if not p.startswith(SUBPROTOCOL_PREFIX)]
    echo = REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in plain else (plain or offered)[0]
    headers = CIMultiDict(request.headers)
    del headers["Sec-WebSocket-Protocol"]
    clone = request.clone(headers=headers)
    clone[_ECHO_PROTOCOL] = echo
    return clone


async def _echo_subprotocol(request: web.Request, response: web.StreamResponse) -> None:
    echo = request.get(_ECHO_PROTOCOL)
    if echo and isinstance(response, web.WebSocketResponse):
        response.headers["Sec-WebSocket-Protocol"] = echo


ACCESS_GUARD = web.AppKey("access_guard", AccessGuard)


def install_access_control(app: web.Application, **options) -> AccessGuard:
    """Put the guard in front of ``app``'s routes and add ``POST /api/token`` and ``GET /api/access``.

    ``options`` are AccessGuard's; its ``peer_sessions`` returns the signaling registry's
    live sessions by pc_id (WebRTC peers hold a per-address slot while they are in it).
    """
    guard = AccessGuard(**options)
    app[ACCESS_GUARD] = guard
    app.middlewares.append(guard.middleware)
    app.on_response_prepare.append(_echo_subprotocol)
    app.router.add_post(TOKEN_PATH, guard.mint_token)
    app.router.add_get("/api/access", guard.describe)
    return guard
