"""JWT minting and verification (HS256, via livekit.api)."""

from __future__ import annotations

import datetime
import warnings
from dataclasses import dataclass, field

from livekit import api
from livekit.protocol import models

_KINDS = {
    "": models.ParticipantInfo.Kind.STANDARD,
    "standard": models.ParticipantInfo.Kind.STANDARD,
    "ingress": models.ParticipantInfo.Kind.INGRESS,
    "egress": models.ParticipantInfo.Kind.EGRESS,
    "sip": models.ParticipantInfo.Kind.SIP,
    "agent": models.ParticipantInfo.Kind.AGENT,
}


class AuthError(Exception):
    pass


@dataclass
class JoinGrant:
    identity: str
    room: str
    name: str = ""
    metadata: str = ""
    kind: int = models.ParticipantInfo.Kind.STANDARD
    attributes: dict[str, str] = field(default_factory=dict)
    can_publish: bool = True
    can_subscribe: bool = True
    can_publish_data: bool = True
    can_update_metadata: bool = True
    hidden: bool = False
    agent: bool = False
    agent_dispatches: list[tuple[str, str]] = field(default_factory=list)  # (name, metadata)


def mint_token(
    api_key: str,
    api_secret: str,
    identity: str,
    room: str,
    *,
    name: str | None = None,
    kind: str | None = None,
    attributes: dict[str, str] | None = None,
    metadata: str | None = None,
    agent: bool = False,
    ttl: datetime.timedelta = datetime.timedelta(hours=1),
) -> str:
    grants = api.VideoGrants(
        room_join=True,
        room=room,
        can_update_own_metadata=True,
        agent=True if agent else None,
    )
    tok = api.AccessToken(api_key, api_secret).with_identity(identity).with_grants(grants)
    tok = tok.with_ttl(ttl)
    if name:
        tok = tok.with_name(name)
    if metadata:
        tok = tok.with_metadata(metadata)
    if attributes:
        tok = tok.with_attributes(dict(attributes))
    if kind is None and agent:
        kind = "agent"
    if kind:
        if kind not in _KINDS:
            raise ValueError(f"unknown participant kind {kind!r}")
        tok = tok.with_kind(kind)  # type: ignore[arg-type]
    with warnings.catch_warnings():  # short test secrets trigger InsecureKeyLengthWarning
        warnings.simplefilter("ignore")
        return tok.to_jwt()


def verify(api_key: str, api_secret: str, token: str) -> api.access_token.Claims:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return api.TokenVerifier(api_key, api_secret).verify(token)
    except Exception as e:  # jwt raises several types
        raise AuthError(str(e)) from e


def join_grant(api_key: str, api_secret: str, token: str) -> JoinGrant:
    claims = verify(api_key, api_secret, token)
    video = claims.video
    if video is None or not video.room_join or not video.room:
        raise AuthError("token has no room_join grant")
    if not claims.identity:
        raise AuthError("token has no identity")
    dispatches = []
    if claims.room_config is not None:
        dispatches = [(a.agent_name, a.metadata) for a in claims.room_config.agents]
    return JoinGrant(
        identity=claims.identity,
        room=video.room,
        name=claims.name or "",
        metadata=claims.metadata or "",
        kind=_KINDS.get(claims.kind or "", models.ParticipantInfo.Kind.STANDARD),
        attributes=dict(claims.attributes or {}),
        can_publish=video.can_publish,
        can_subscribe=video.can_subscribe,
        can_publish_data=video.can_publish_data,
        can_update_metadata=bool(video.can_update_own_metadata),
        hidden=bool(video.hidden),
        agent=bool(video.agent),
        agent_dispatches=dispatches,
    )
