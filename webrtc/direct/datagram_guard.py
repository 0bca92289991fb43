"""Datagrams our aiortc connections must not be handed: an empty one ends the call.

aioice hands every datagram that is not STUN to aiortc, from whatever address it came; aiortc's
DTLS transport reads its first byte to tell DTLS from SRTP, so an empty datagram raises there,
its receive loop ends, and the call with it. One empty UDP datagram to the call's port, which
anyone on the path can send with any source address, would hang up on the caller. Anything else
that is not the peer's is dropped further in by the crypto that it cannot pass (DTLS discards
records it cannot read, libsrtp packets it cannot authenticate).

``drop_empty_datagrams(pc)`` wraps ``Connection.data_received`` (aioice's hand-off to aiortc) on
each of ``pc``'s connections; the version checked is in ``webrtc.private_internals``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aioice import Connection
from aiortc import RTCPeerConnection

from duplex_agent.webrtc.direct.ice_consent import ice_connections

logger = logging.getLogger("duplex_agent.webrtc")


class EmptyDatagramGuard:
    """Drops the empty datagrams of one connection before aiortc sees them; counts them in ``dropped``."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.dropped = 0
        self._hand_on: Callable[[bytes, int], None] = connection.data_received

    def install(self) -> None:
        setattr(self.connection, "data_received", self.data_received)  # noqa: B010 (replaced on one instance)

    def data_received(self, data: bytes, component: int) -> None:
        if data:
            self._hand_on(data, component)
            return
        self.dropped += 1
        if self.dropped == 1:
            logger.warning("dropping empty datagrams on %s (they would end the call)", self.connection)


def drop_empty_datagrams(pc: RTCPeerConnection) -> list[EmptyDatagramGuard]:
    """The guard on each of ``pc``'s ICE connections (those guarded already keep theirs); call it
    once the remote description is set."""
    guards = []
    for connection in ice_connections(pc):
        guard = installed_guard(connection)
        if guard is None:
            guard = EmptyDatagramGuard(connection)
            guard.install()
        guards.append(guard)
    return guards


def installed_guard(connection: Connection) -> EmptyDatagramGuard | None:
    """The guard installed on ``connection``, found through the method it replaced (a registry
    beside the connections would keep each one, and its call, alive for good)."""
    guard = getattr(connection.data_received, "__self__", None)
    return guard if isinstance(guard, EmptyDatagramGuard) else None
