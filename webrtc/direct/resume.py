"""Conversations of direct peers that dropped, kept for a while so the page can come back.

A peer that asked to be resumable (``"resumable": true`` in its offer) gets a
resume token with its answer. When its connection, data channel or track goes,
its conversation is parked for ``grace_s`` instead of closed; an offer with
``"resume": {"pc_id", "resume_token"}`` claims it for a new peer connection
(the token is single-use; the new answer carries the next one). Nobody coming
back closes it with ``disconnect_grace_expired``, as the realtime websocket does.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass

from duplex_agent.agent.session.ports import Conversation

logger = logging.getLogger("duplex_agent.webrtc")


class ResumeRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class _Parked:
    conversation: Conversation
    expiry: asyncio.Task[None]


class ParkedConversations:
    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self._digests: dict[str, bytes] = {}  # pc_id -> digest of its current token
        self._parked: dict[str, _Parked] = {}

    def issue(self, pc_id: str) -> str:
        """A resume token for the peer ``pc_id`` (replacing any earlier one)."""
        token = secrets.token_urlsafe(24)
        self._digests[pc_id] = hashlib.sha256(token.encode()).digest()
        return token

    def token_matches(self, pc_id: str, token: str) -> bool:
        """Whether ``token`` is ``pc_id``'s current one; nothing is claimed."""
        digest = self._digests.get(pc_id)
        return digest is not None and hmac.compare_digest(digest, hashlib.sha256(token.encode()).digest())

    def is_resumable(self, pc_id: str) -> bool:
        return pc_id in self._digests and self.grace_s > 0

    def forget(self, pc_id: str) -> None:
        self._digests.pop(pc_id, None)

    def park(self, pc_id: str, conversation: Conversation) -> None:
        expiry = asyncio.create_task(self._expire(pc_id), name=f"parked-{pc_id}")
        self._parked[pc_id] = _Parked(conversation, expiry)
        logger.info("peer %s dropped; its conversation waits %g s for a resume", pc_id, self.grace_s)

    def claim(self, pc_id: str, token: str) -> Conversation:
        """The parked conversation of ``pc_id``; ResumeRefused when gone or the token is wrong."""
        parked = self._parked.get(pc_id)
        if parked is None:
            raise ResumeRefused(404, "session_resume_expired", f"no conversation of peer {pc_id!r} to resume")
        digest = self._digests.get(pc_id, b"")
        if not hmac.compare_digest(digest, hashlib.sha256(token.encode()).digest()):
            raise ResumeRefused(403, "invalid_resume_token", "invalid resume token")
        del self._parked[pc_id]
        self.forget(pc_id)
        parked.expiry.cancel()
        return parked.conversation

    async def discard(self, pc_id: str, reason: str) -> bool:
        """Close ``pc_id``'s parked conversation now (the page hung up); False when none is parked."""
        parked = self._parked.pop(pc_id, None)
        self.forget(pc_id)
        if parked is None:
            return False
        parked.expiry.cancel()
        await parked.conversation.close(reason)
        return True

    async def _expire(self, pc_id: str) -> None:
        await asyncio.sleep(self.grace_s)
        parked = self._parked.pop(pc_id, None)
        self.forget(pc_id)
        if parked is not None:
            await parked.conversation.close("disconnect_grace_expired")

    async def close_all(self) -> None:
        parked, self._parked = list(self._parked.values()), {}
        for entry in parked:
            entry.expiry.cancel()
        await asyncio.gather(*(entry.conversation.close("shutdown") for entry in parked), return_exceptions=True)
