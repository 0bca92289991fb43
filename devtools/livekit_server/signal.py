"""The signal websockets and their validate endpoints, as livekit-server serves them.

- ``/rtc/v1`` (one peer connection; what the SDKs ask for first: livekit-client 2.x, and the
  Rust core behind ``livekit.rtc`` with its default ``single_peer_connection``): the join
  request comes in the ``join_request`` query parameter, a base64url ``WrappedJoinRequest``
  (its ``JoinRequest`` gzipped or not) that may carry the participant's first offer;
- ``/rtc`` (v0, two peer connections): the join settings come as query parameters. An SDK
  falls back to it only when ``/rtc/v1`` answers 404 (a LiveKit server older than v1).

``/rtc/v1/validate`` and ``/rtc/validate`` answer what the websocket would have: 401 for a bad
token, 400 for a v1 request without its join request, else 200 ``success``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gzip
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from livekit.protocol import models, rtc

from . import auth
from .ids import new_sid
from .participant import Participant, ParticipantOptions

if TYPE_CHECKING:
    from .server import ServerCore

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 16
SERVER_VERSION = "1.9.0-loopback"
PING_INTERVAL = 5
PING_TIMEOUT = 15


def _token(request: web.Request) -> str:
    tok = request.query.get("access_token", "")
    if not tok:
        authz = request.headers.get("Authorization", "")
        if authz.lower().startswith("bearer "):
            tok = authz[7:].strip()
    return tok


def server_info(node_id: str) -> models.ServerInfo:
    return models.ServerInfo(
        edition=models.ServerInfo.Edition.Standard,
        version=SERVER_VERSION,
        protocol=PROTOCOL_VERSION,
        node_id=node_id,
        agent_protocol=1,
    )


def _capabilities(raw: str) -> list[int]:
    caps = []
    for name in filter(None, (s.strip() for s in raw.split(","))):
        with contextlib.suppress(ValueError):
            caps.append(models.ClientInfo.Capability.Value(name))
    return caps


class JoinRequestError(ValueError):
    pass


def join_request(raw: str) -> rtc.JoinRequest:
    """The ``join_request`` query parameter of ``/rtc/v1``: base64url of a ``WrappedJoinRequest``."""
    try:
        wrapped = rtc.WrappedJoinRequest.FromString(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError) as e:
        raise JoinRequestError(f"cannot decode wrapped join request: {e}") from None
    data = wrapped.join_request
    if wrapped.compression == rtc.WrappedJoinRequest.Compression.GZIP:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise JoinRequestError(f"cannot read decompressed join request: {e}") from None
    try:
        return rtc.JoinRequest.FromString(data)
    except ValueError as e:
        raise JoinRequestError(f"cannot unmarshal join request: {e}") from None


async def validate(server: ServerCore, request: web.Request) -> web.Response:
    try:
        auth.join_grant(server.api_key, server.api_secret, _token(request))
    except auth.AuthError as e:
        return web.Response(status=401, text=f"invalid token: {e}")
    return web.Response(status=200, text="success")


async def validate_v1(server: ServerCore, request: web.Request) -> web.Response:
    response = await validate(server, request)
    raw = request.query.get("join_request")
    if response.status != 200:
        return response
    if not raw:
        return web.Response(status=400, text="join_request is required")
    try:
        join_request(raw)
    except JoinRequestError as e:
        return web.Response(status=400, text=str(e))
    return response


async def rtc_socket(server: ServerCore, request: web.Request) -> web.StreamResponse:
    """``/rtc``: the v0 signal websocket (two peer connections)."""
    try:
        grant = auth.join_grant(server.api_key, server.api_secret, _token(request))
    except auth.AuthError as e:
        return web.Response(status=401, text=f"invalid token: {e}")
    if request.query.get("reconnect") in ("1", "true"):
        # resume is not supported: make the SDK do a full rejoin
        return web.Response(status=404, text="resume not supported")
    q = request.query
    options = ParticipantOptions(
        auto_subscribe=q.get("auto_subscribe", "1") not in ("0", "false"),
        client_protocol=int(q.get("client_protocol", "0") or 0),
        capabilities=_capabilities(q.get("capabilities", "")),
        sdk=q.get("sdk", ""),
    )
    return await _session(server, request, grant, options)


async def rtc_v1_socket(server: ServerCore, request: web.Request) -> web.StreamResponse:
    """``/rtc/v1``: the v1 signal websocket (one peer connection, the participant offers)."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return web.Response(status=404)  # as livekit-server: only a websocket upgrade is served here
    try:
        grant = auth.join_grant(server.api_key, server.api_secret, _token(request))
    except auth.AuthError as e:
        return web.Response(status=401, text=f"invalid token: {e}")
    if not request.query.get("join_request"):
        return web.Response(status=400, text="join_request is required")
    try:
        join = join_request(request.query["join_request"])
    except JoinRequestError as e:
        return web.Response(status=400, text=str(e))
    if join.reconnect:
        # resume is not supported: make the SDK do a full rejoin
        return web.Response(status=404, text="resume not supported")
    client = join.client_info
    options = ParticipantOptions(
        auto_subscribe=join.connection_settings.auto_subscribe,
        client_protocol=client.protocol,
        capabilities=list(client.capabilities),
        sdk=models.ClientInfo.SDK.Name(client.sdk) if client.sdk else "",
        single_pc=True,
    )
    return await _session(server, request, grant, options, join)


async def _session(server: ServerCore, request: web.Request, grant: auth.JoinGrant, options: ParticipantOptions,
                   join: rtc.JoinRequest | None = None) -> web.WebSocketResponse:
    """One participant's signal websocket, from its JoinResponse to its leaving."""
    ws = web.WebSocketResponse(max_msg_size=0, timeout=2.0)
    await ws.prepare(request)
    room, created = server.get_or_create_room(grant.room)
    now = time.time()
    info = models.ParticipantInfo(
        sid=new_sid("PA_"),
        identity=grant.identity,
        name=grant.name,
        metadata=grant.metadata,
        state=models.ParticipantInfo.State.JOINED,
        kind=grant.kind,
        joined_at=int(now),
        joined_at_ms=int(now * 1000),
        version=1,
        client_protocol=options.client_protocol,
        permission=models.ParticipantPermission(
            can_subscribe=grant.can_subscribe,
            can_publish=grant.can_publish,
            can_publish_data=grant.can_publish_data,
            can_update_metadata=grant.can_update_metadata,
            hidden=grant.hidden,
            agent=grant.agent,
        ),
    )
    info.attributes.update(grant.attributes)
    info.capabilities.extend(options.capabilities)

    async def _send(msg: rtc.SignalResponse) -> None:
        if not ws.closed:
            await ws.send_bytes(msg.SerializeToString())

    p = Participant(room, info, _send, options, server.allowed_ips)
    p.close_transport = ws.close
    old = await room.add_participant(p)
    if old is not None:
        await old.send(rtc.SignalResponse(leave=rtc.LeaveRequest(
            reason=models.DisconnectReason.DUPLICATE_IDENTITY,
            action=rtc.LeaveRequest.Action.DISCONNECT)))
        await old.close()

    response = rtc.JoinResponse(
        room=room.info(),
        participant=p.info,
        other_participants=[o.info for o in room.visible(exclude=p)],
        server_version=SERVER_VERSION,
        subscriber_primary=not options.single_pc,
        ping_timeout=PING_TIMEOUT,
        ping_interval=PING_INTERVAL,
        server_info=server_info(server.node_id),
        # As LiveKit (no ICE fallback here): a publisher's SDK then queues a negotiation asked for
        # while an offer is under way; without it, it debounces and drops that request, and a track
        # published as the server asks for a receiving section is never offered.
        fast_publish=grant.can_publish,
    )
    await p.send(rtc.SignalResponse(join=response))
    await room.announce(p)
    if not options.single_pc:
        p.negotiate_subscriber()  # initial server offer (data channels + existing tracks)
    elif join is not None:  # what the participant sent with its join: tracks to add, its first offer
        for add in join.add_track_requests:
            await p.handle(rtc.SignalRequest(add_track=add))
        if join.HasField("publisher_offer"):
            await p.handle(rtc.SignalRequest(offer=join.publisher_offer))
    if created:
        server.on_room_created(room, grant)

    server.track_socket(ws)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                req = rtc.SignalRequest()
                try:
                    req.ParseFromString(msg.data)
                except Exception:
                    log.warning("undecodable signal request from %s", p.identity)
                    continue
                try:
                    await p.handle(req)
                except Exception:
                    log.exception("error handling %s from %s", req.WhichOneof("message"), p.identity)
            elif msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
            if p.closed:
                break
    except asyncio.CancelledError:
        pass
    finally:
        server.untrack_socket(ws)
        await room.remove_participant(p, models.DisconnectReason.CLIENT_INITIATED)
        if not ws.closed:
            await ws.close()
    return ws
