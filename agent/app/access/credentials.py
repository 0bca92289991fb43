"""The API key and the short-lived session tokens minted from it.

A token is ``dat1.<expiry unix s>.<nonce>.<signature>``: HMAC-SHA256 over the first
three parts, keyed by a key derived from the API key, so the server keeps no token
state and changing the key revokes every token. A token opens sessions (signaling,
the realtime websocket, LiveKit dev tokens) until it expires; it cannot mint tokens
or read metrics, which take the key itself.

Credentials travel as ``Authorization: Bearer <key or token>``, or, for browsers
(which cannot set headers on a websocket), as the websocket subprotocol
``openai-insecure-api-key.<key or token>``, as OpenAI's browser clients send it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from aiohttp import web

TOKEN_PREFIX = "dat1"
SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
#: The longest lifetime a token may be minted with.
MAX_TOKEN_TTL_S = 24 * 3600.0


class AccessDenied(Exception):
    """A request without valid credentials; ``str()`` is the reason the client is told."""


@dataclass(frozen=True)
class Credential:
    """What a request presented, and where it came from (header or websocket subprotocol)."""

    value: str
    subprotocol: str | None = None


def presented_credential(request: web.Request) -> Credential | None:
    """The key or token in the Authorization header, else in a websocket subprotocol."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AccessDenied("the Authorization header must be 'Bearer <key or token>'")
        return Credential(value.strip())
    for offered in offered_subprotocols(request):
        if offered.startswith(SUBPROTOCOL_PREFIX):
            return Credential(offered[len(SUBPROTOCOL_PREFIX):], subprotocol=offered)
    return None


def offered_subprotocols(request: web.Request) -> list[str]:
    return [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class AccessKeys:
    """Checks the key and mints and verifies session tokens."""

    def __init__(self, api_key: str, *, token_ttl_s: float = 300.0, clock=time.time) -> None:
        if not api_key:
            raise ValueError("an empty API key cannot protect anything")
        self._key = api_key.encode("utf-8")
        self._signing_key = hmac.new(self._key, b"duplex-agent session token v1", hashlib.sha256).digest()
        self.token_ttl_s = token_ttl_s
        self._clock = clock

    def is_key(self, value: str) -> bool:
        return hmac.compare_digest(value.encode("utf-8"), self._key)

    def mint(self, ttl_s: float | None = None) -> tuple[str, int]:
        """A fresh token and its expiry (unix seconds)."""
        ttl = self.token_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= MAX_TOKEN_TTL_S:
            raise ValueError(f"a token lives between 0 and {MAX_TOKEN_TTL_S:g} s, not {ttl:g}")
        expires = int(self._clock() + ttl)
        body = f"{TOKEN_PREFIX}.{expires}.{_b64(secrets.token_bytes(12))}"
        return f"{body}.{self._sign(body)}", expires

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._signing_key, body.encode("ascii"), hashlib.sha256).digest())

    def check_token(self, value: str) -> None:
        """Raise AccessDenied unless ``value`` is a token this key signed that has not expired."""
        body, _, signature = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1].isdigit():
            raise AccessDenied("the credential is neither the API key nor a session token")
        if not hmac.compare_digest(signature.encode("ascii", "replace"), self._sign(body).encode("ascii")):
            raise AccessDenied("the session token's signature does not match this server's key")
        left = int(parts[1]) - self._clock()
        if left <= 0:
            raise AccessDenied(f"the session token expired {-left:.0f} s ago; get a new one")

    def check(self, credential: Credential | None, *, key_only: bool = False) -> None:
        """Raise AccessDenied unless the credential is the key (or, unless ``key_only``, a live token)."""
        if credential is None:
            raise AccessDenied("this route needs credentials: 'Authorization: Bearer <key or token>' or the "
                               f"websocket subprotocol '{SUBPROTOCOL_PREFIX}<key or token>'")
        if self.is_key(credential.value):
            return
        if not credential.value.startswith(TOKEN_PREFIX + "."):
            raise AccessDenied("wrong API key")
        if key_only:
            raise AccessDenied("this route needs the API key; a session token only opens sessions")
        self.check_token(credential.value)
