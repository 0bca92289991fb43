"""Development tokens for the page's LiveKit mode.

``GET /api/livekit/config`` tells the page whether this server can mint tokens
(``{"enabled": bool, "url": str | null, "agent_name": str | null}``);
``POST /api/livekit/token`` with ``{"room", "identity"}`` answers
``{"url", "token", "room", "identity"}``: a token that joins ``room`` as
``identity``, may publish, subscribe and send data, and names our agent in the
room's dispatch configuration, so the first join creates the room and
dispatches the agent to it.

These routes hand a token to anyone who can reach the server: they are meant
for development (the server listens on 127.0.0.1 by default). Errors are
``{"error": {"code", "message"}}``: 400 for a bad request, 404 when no LiveKit
credentials were configured, 413 for a body over 4 KiB.
"""

from __future__ import annotations

import datetime
import json
import re
import warnings
from dataclasses import dataclass

from aiohttp import web

from duplex_agent.agent.protocol.request_body import BodyTooLarge, read_whole_body

TOKEN_TTL = datetime.timedelta(hours=1)
#: Room names and identities the page may ask for: short, printable, no spaces.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
MAX_BODY_BYTES = 4096


@dataclass(frozen=True)
class LiveKitTokenIssuer:
    """Mints room tokens for one LiveKit deployment and one agent name."""

    url: str
    api_key: str
    api_secret: str
    agent_name: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.url and self.api_key and self.api_secret)

    def mint(self, room: str, identity: str) -> str:
        from livekit import api

        grants = api.VideoGrants(room_join=True, room=room, can_publish=True, can_subscribe=True,
                                 can_publish_data=True)
        token = (api.AccessToken(self.api_key, self.api_secret)
                 .with_identity(identity).with_name(identity).with_grants(grants).with_ttl(TOKEN_TTL))
        dispatch = _agent_dispatch_config(self.agent_name)
        if dispatch is not None:
            token = token.with_room_config(dispatch)
        with warnings.catch_warnings():  # short development secrets make PyJWT warn
            warnings.simplefilter("ignore")
            return token.to_jwt()


def _agent_dispatch_config(agent_name: str):
    """``RoomConfiguration(agents=[RoomAgentDispatch(agent_name)])``, where livekit.api has it."""
    if not agent_name:
        return None
    from livekit import api

    configuration = getattr(api, "RoomConfiguration", None)
    dispatch = getattr(api, "RoomAgentDispatch", None)
    if configuration is None or dispatch is None or not hasattr(api.AccessToken, "with_room_config"):
        return None
    return configuration(agents=[dispatch(agent_name=agent_name)])


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def _field(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"'{name}' is required and must be a non-empty string")
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"'{name}' must be 1-128 characters of letters, digits and _ . : @ -, "
                         "starting with a letter or digit")
    return value


def register_livekit_token_routes(app: web.Application, *, url: str | None, api_key: str | None,
                                  api_secret: str | None, agent_name: str = "") -> LiveKitTokenIssuer:
    """Add ``GET /api/livekit/config`` and ``POST /api/livekit/token`` to ``app``.

    With any of ``url``, ``api_key``, ``api_secret`` empty the routes still
    exist: config says ``enabled: false`` and token answers 404.
    """
    issuer = LiveKitTokenIssuer(url or "", api_key or "", api_secret or "", agent_name or "")

    async def config(_request: web.Request) -> web.Response:
        return web.json_response({
            "enabled": issuer.enabled,
            "url": issuer.url if issuer.enabled else None,
            "agent_name": issuer.agent_name if issuer.enabled and issuer.agent_name else None,
        }, headers={"Cache-Control": "no-store"})

    async def token(request: web.Request) -> web.Response:
        if not issuer.enabled:
            return _error(404, "livekit_not_configured",
                          "this server has no LiveKit credentials (set LIVEKIT_URL, LIVEKIT_API_KEY "
                          "and LIVEKIT_API_SECRET); paste a token from your LiveKit deployment instead")
        try:
            body = json.loads((await read_whole_body(request, MAX_BODY_BYTES)).decode("utf-8"))
        except BodyTooLarge as exc:
            return _error(exc.status, exc.code, str(exc))
        except (ValueError, UnicodeDecodeError):
            return _error(400, "invalid_json", "the body must be a JSON object {\"room\", \"identity\"}")
        if not isinstance(body, dict):
            return _error(400, "invalid_json", "the body must be a JSON object {\"room\", \"identity\"}")
        try:
            room = _field(body, "room")
            identity = _field(body, "identity")
        except ValueError as exc:
            return _error(400, "invalid_request", str(exc))
        return web.json_response(
            {"url": issuer.url, "token": issuer.mint(room, identity), "room": room, "identity": identity},
            headers={"Cache-Control": "no-store"})

    app.router.add_get("/api/livekit/config", config)
    app.router.add_post("/api/livekit/token", token)
    return issuer
