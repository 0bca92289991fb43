"""LiveKit's server API as livekit-server serves it: twirp over HTTP POST at
``/twirp/livekit.<Service>/<Method>``, the body a protobuf (``application/protobuf``, what the
server SDKs send) or its JSON, the caller's grants in a bearer token.

An error is twirp's JSON, ``{"code", "msg", "meta"}``, under the HTTP status twirp gives its
code; livekit-api raises it as ``ServerError`` (``SipCallError`` when ``meta`` carries a SIP
status). A request without a valid token is refused before its method runs, as LiveKit's
auth middleware does; each method checks the grants it needs itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from livekit import api

from . import auth

log = logging.getLogger(__name__)

PREFIX = "/twirp/livekit."

#: twirp's HTTP status for each of its error codes.
HTTP_STATUS = {
    "canceled": 408, "unknown": 500, "invalid_argument": 400, "malformed": 400, "deadline_exceeded": 408,
    "not_found": 404, "bad_route": 404, "already_exists": 409, "permission_denied": 403,
    "unauthenticated": 401, "resource_exhausted": 429, "failed_precondition": 412, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503, "dataloss": 500,
}


class TwirpError(Exception):
    """A twirp error: its code, message and metadata go to the client as they are."""

    def __init__(self, code: str, msg: str, meta: dict[str, str] | None = None) -> None:
        super().__init__(msg)
        if code not in HTTP_STATUS:
            raise ValueError(f"not a twirp error code: {code!r}")
        self.code = code
        self.msg = msg
        self.meta = dict(meta or {})

    def response(self) -> web.Response:
        body: dict[str, Any] = {"code": self.code, "msg": self.msg}
        if self.meta:
            body["meta"] = self.meta
        return web.json_response(body, status=HTTP_STATUS[self.code])


def permission_denied() -> TwirpError:
    """What LiveKit answers a token without the grant a method needs (its ``twirpAuthError``)."""
    return TwirpError("unauthenticated", "permissions denied")


def require_room_admin(claims: api.access_token.Claims, room: str) -> None:
    """LiveKit's ``EnsureAdminPermission``: ``room_admin`` for exactly this room."""
    video = claims.video
    if video is None or not video.room_admin or video.room != room:
        raise permission_denied()


def require_room_create(claims: api.access_token.Claims) -> None:
    """LiveKit's ``EnsureCreatePermission``."""
    if claims.video is None or not claims.video.room_create:
        raise permission_denied()


def require_sip_call(claims: api.access_token.Claims) -> None:
    """LiveKit's ``EnsureSIPCallPermission``: the ``sip.call`` grant."""
    if claims.sip is None or not claims.sip.call:
        raise permission_denied()


def require_sip_admin(claims: api.access_token.Claims) -> None:
    """LiveKit's ``EnsureSIPAdminPermission``: the ``sip.admin`` grant."""
    if claims.sip is None or not claims.sip.admin:
        raise permission_denied()


Handler = Callable[[api.access_token.Claims, Any], Awaitable[Message]]


@dataclass(frozen=True)
class Method:
    request_type: type[Message]
    handler: Handler


class TwirpRouter:
    """Every twirp method this server answers, by ``Service/Method``; an unknown one is twirp's
    ``bad_route``, as livekit-server answers a method it lacks."""

    def __init__(self, api_key: str, api_secret: str) -> None:
        self._api_key = api_key
        self._api_secret = api_secret
        self._methods: dict[str, Method] = {}
        self.calls: list[tuple[str, str]] = []  # (Service/Method, twirp code or "ok"), in order

    def add(self, service: str, method: str, request_type: type[Message], handler: Handler) -> None:
        self._methods[f"{service}/{method}"] = Method(request_type, handler)

    def register(self, app: web.Application) -> None:
        app.router.add_post(PREFIX + "{service}/{method}", self._handle)

    async def _handle(self, request: web.Request) -> web.Response:
        name = f"{request.match_info['service']}/{request.match_info['method']}"
        try:
            response = await self._answer(request, name)
        except TwirpError as exc:
            self.calls.append((name, exc.code))
            return exc.response()
        self.calls.append((name, "ok"))
        return response

    async def _answer(self, request: web.Request, name: str) -> web.Response:
        method = self._methods.get(name)
        if method is None:
            raise TwirpError("bad_route", f"no handler for path {request.path!r}")
        claims = self._claims(request)
        as_json = request.content_type == "application/json"
        body = await request.read()
        message = method.request_type()
        try:
            if as_json:
                json_format.Parse(body or b"{}", message, ignore_unknown_fields=True)
            else:
                message.ParseFromString(body)
        except (DecodeError, json_format.ParseError) as exc:
            raise TwirpError("malformed", f"the request body could not be decoded: {exc}") from None
        result = await method.handler(claims, message)
        if as_json:
            return web.json_response(json_format.MessageToDict(result))
        return web.Response(body=result.SerializeToString(), content_type="application/protobuf")

    def _claims(self, request: web.Request) -> api.access_token.Claims:
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("Bearer "):
            raise TwirpError("unauthenticated", "invalid authorization header. Must start with Bearer ")
        try:
            return auth.verify(self._api_key, self._api_secret, authorization[len("Bearer "):])
        except auth.AuthError as exc:
            raise TwirpError("unauthenticated", f"invalid token: {exc}") from None
