"""ICE consent freshness (RFC 7675) on our aiortc connections, judged so that a held-up loop is not a lost peer.

aioice keeps consent with one check every 4-6 s; it waits half a second for the answer, drops an
answer that comes later, and closes the connection after six checks in a row went unanswered. A loop
held up for half a second (ours, before it reads the answer, or the peer's, before it writes it) then
counts as a peer that withdrew consent, and a call whose packets still flow both ways ends.

``ConsentKeeper`` takes that role over for one aioice connection, by the RFC's rules:

- consent is an authenticated STUN binding success response to one of our consent checks, from the
  remote address the check went to, and lasts ``CONSENT_EXPIRY_S`` (30 s; an endpoint may use less,
  never more). When it runs out we stop sending on the pair by closing the connection, as aioice does,
  after telling the owner why (``ConsentLost``);
- a check goes out every 4-6 s (5 s randomized 0.8-1.2), each with a new transaction ID, each sent
  once. The RFC says that an answer may be for an earlier check than the latest, so every check of the
  last 30 s stays open for its answer. That is the whole cure for a starved loop: an answer held up
  by either loop still renews consent, and only 30 s with no answer at all ends the call. Sending
  a check again (which the RFC does not do) would not help: an answer held up by a loop is late, not
  lost, and six checks to a window ride out the loss of a few;
- an authenticated 403 answer revokes consent at once; checks still open are discarded when consent
  ends; error answers of any other kind neither renew nor end it.

Media from the peer (SRTP, DTLS) is not counted as consent, though it would keep a call up just as
well: consent is the peer's proof that it receives at that address and wants our packets, and only
an answer carrying our random transaction ID proves that (a datagram's source address can be forged;
the answer to a question only its receiver saw cannot). The media timeout
(``media_timeout.MediaWatchdog``) is what judges a caller by its packets.

The expiry itself is judged by a ``MediaWatchdog`` on the time of the latest answer: a timer that
fires late means our loop was held up, and the answers of that time may still be queued in the
socket behind the call's media, so they get up to ``media_timeout.STALL_GRACE_S`` to be read (and the
check sent as the loop wakes, its answer) before the call is judged.

It reaches into aioice's connection (``Connection.query_consent``, replaced per connection, and
``_nominated``, ``build_request``, ``remote_password``, the pairs' ``protocol.transactions`` and
``send_stun``) and into aiortc's ``RTCIceTransport._connection`` (``ice_connections``, which
``datagram_guard`` uses too); the versions checked are in ``webrtc.private_internals``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from aioice import Connection, stun
from aiortc import RTCIceTransport, RTCPeerConnection

from duplex_agent.webrtc.direct.media_timeout import MediaWatchdog

logger = logging.getLogger("duplex_agent.webrtc")

#: RFC 7675: consent lasts 30 s from the latest answer.
CONSENT_EXPIRY_S = 30.0
#: RFC 7675: a check every 5 s on average (never under 4 s), randomized so that peers do not fall into step.
CHECK_INTERVAL_S = 5.0
#: About this many checks fall in one expiry window at the RFC's figures; a shorter expiry keeps the count.
CHECKS_PER_EXPIRY = 6
CONSENT_EXPIRED = "consent_expired"
CONSENT_REVOKED = "consent_revoked"
_FORBIDDEN = 403


class ConsentLost(ConnectionError):
    """The peer's consent to receive ended: ``code`` is ``consent_expired`` or ``consent_revoked``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConsentHookUnavailable(RuntimeError):
    """The installed aioice or aiortc no longer has what the keeper takes over."""


def _check_shape(connection: Connection) -> None:
    missing = [name for name in ("query_consent", "build_request", "remote_password", "_nominated")
               if not hasattr(connection, name)]
    if missing:
        raise ConsentHookUnavailable(f"aioice's Connection has no {', '.join(missing)}: "
                                     "see webrtc.private_internals for the version the consent keeper was checked on")


class _Check:
    """One consent check awaiting its answer: aioice's protocol hands it any STUN response with its
    transaction ID (``response_received``, as it does its own transactions)."""

    __slots__ = ("keeper", "transaction_id", "component", "remote_addr", "protocol", "sent_at")

    def __init__(self, keeper: ConsentKeeper, transaction_id: bytes, component: int, remote_addr: tuple[str, int],
                 protocol: Any, sent_at: float) -> None:
        self.keeper = keeper
        self.transaction_id = transaction_id
        self.component = component
        self.remote_addr = remote_addr
        self.protocol = protocol
        self.sent_at = sent_at

    def response_received(self, message: stun.Message, addr: tuple[str, int]) -> None:
        self.keeper._answered(self, message, addr)

    def discard(self) -> None:
        if self.protocol.transactions.get(self.transaction_id) is self:
            del self.protocol.transactions[self.transaction_id]


class ConsentKeeper:
    """Consent freshness for one aioice connection, in place of aioice's own (``install``).

    ``on_lost(ConsentLost)`` is called once when consent ends, before the connection closes.
    ``expiry_s`` may be shorter than the RFC's 30 s (never longer); the checks then come
    ``CHECKS_PER_EXPIRY`` to a window, as at the RFC's figures. ``checks_sent`` and ``answers``
    count what went out and what came back renewing consent.
    """

    def __init__(self, connection: Connection, on_lost: Callable[[ConsentLost], None] | None = None, *,
                 expiry_s: float = CONSENT_EXPIRY_S, interval_s: float | None = None) -> None:
        if not 0 < expiry_s <= CONSENT_EXPIRY_S:
            raise ValueError(f"consent expiry must be more than 0 and at most {CONSENT_EXPIRY_S:g} s (RFC 7675), "
                             f"not {expiry_s!r}")
        if interval_s is None:
            interval_s = min(CHECK_INTERVAL_S, expiry_s / CHECKS_PER_EXPIRY)
        if not 0 < interval_s * 1.2 < expiry_s:
            raise ValueError(f"consent checks every {interval_s!r} s cannot renew a {expiry_s:g} s consent")
        _check_shape(connection)
        self.connection = connection
        self.expiry_s = expiry_s
        self.interval_s = interval_s
        self._on_lost = on_lost
        self.checks_sent = 0
        self.answers = 0
        self.lost: ConsentLost | None = None
        self._answered_at: dict[int, float] = {}  # component -> loop time of its latest answer
        self._open: dict[bytes, _Check] = {}  # transaction ID -> check awaiting its answer
        self._lost_signal: asyncio.Future[None] | None = None
        self._closing: asyncio.Task[None] | None = None

    def install(self) -> None:
        """aioice starts ``query_consent`` once ICE completes: this keeper's ``run`` is it for this connection."""
        setattr(self.connection, "query_consent", self.run)  # noqa: B010 (a method replaced on one instance)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._lost_signal = loop.create_future()
        now = loop.time()
        # ICE's own checks have just been answered: consent starts now, for each pair in use.
        self._answered_at = {component: now for component in self._pairs()}
        watch = MediaWatchdog(self.expiry_s, self._oldest_answer, self._expired)
        watch.start()
        try:
            while True:
                done, _ = await asyncio.wait([self._lost_signal], timeout=self._next_interval())
                if done:
                    break
                self._send_checks(loop.time())
        finally:
            watch.close()
            for check in list(self._open.values()):
                check.discard()
            self._open.clear()
        # Stop sending on the pair. aioice's close() cancels and awaits this task (its consent task),
        # so the close runs as a task of its own, once this one has ended.
        self._closing = loop.create_task(self.connection.close(), name="ice-consent-close")

    # ---- checks and answers ----

    def _pairs(self) -> dict[int, Any]:
        return dict(self.connection._nominated)

    def _next_interval(self) -> float:
        return self.interval_s * (0.8 + 0.4 * random.random())

    def _oldest_answer(self) -> float | None:
        return min(self._answered_at.values(), default=None)

    def _send_checks(self, now: float) -> None:
        for check in [c for c in self._open.values() if now - c.sent_at >= self.expiry_s]:
            check.discard()  # an answer this late could not have kept consent
            del self._open[check.transaction_id]
        password = self.connection.remote_password
        assert password is not None  # connect() had it, or this would not run
        for component, pair in self._pairs().items():
            request = self.connection.build_request(pair, nominate=False)
            request.add_message_integrity(password.encode("utf8"))
            check = _Check(self, request.transaction_id, component, pair.remote_addr, pair.protocol, now)
            pair.protocol.transactions[request.transaction_id] = check
            self._open[request.transaction_id] = check
            pair.protocol.send_stun(request, pair.remote_addr)
            self.checks_sent += 1

    def _answered(self, check: _Check, message: stun.Message, addr: tuple[str, int]) -> None:
        if self.lost is not None or self._open.get(check.transaction_id) is not check:
            return
        password = self.connection.remote_password
        if tuple(addr) != tuple(check.remote_addr) or password is None \
                or not message.check_message_integrity(password.encode("utf8")):
            return  # not from the pair's peer, or not signed by it: the check stays open
        check.discard()
        del self._open[check.transaction_id]
        if message.message_class == stun.Class.RESPONSE:
            loop = asyncio.get_running_loop()
            self._answered_at[check.component] = max(self._answered_at.get(check.component, 0.0), loop.time())
            self.answers += 1
        elif message.error_code == _FORBIDDEN:
            self._lose(ConsentLost(CONSENT_REVOKED, "the peer revoked its consent to receive (STUN 403)"))

    def _expired(self) -> None:
        self._lose(ConsentLost(CONSENT_EXPIRED, f"no answer to the ICE consent checks for {self.expiry_s:g} s"))

    def _lose(self, lost: ConsentLost) -> None:
        if self.lost is not None:
            return
        self.lost = lost
        logger.info("ICE consent lost on %s: %s", self.connection, lost)  # the owner says what it ends
        if self._on_lost is not None:
            try:
                self._on_lost(lost)
            except Exception:  # the owner's trouble must not keep the connection sending
                logger.exception("the consent-lost handler failed")
        if self._lost_signal is not None and not self._lost_signal.done():
            self._lost_signal.set_result(None)


def ice_connections(pc: RTCPeerConnection) -> list[Connection]:
    """The aioice connections of ``pc``'s ICE transports (one, when bundled), from aiortc's ``_connection``."""
    found: dict[int, Connection] = {}
    dtls = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        dtls.append(pc.sctp.transport)
    for transport in dtls:
        ice: RTCIceTransport = transport.transport
        connection = getattr(ice, "_connection", None)
        if not isinstance(connection, Connection):
            raise ConsentHookUnavailable("aiortc's RTCIceTransport has no aioice connection at _connection: "
                                         "see webrtc.private_internals")
        found.setdefault(id(connection), connection)
    return list(found.values())


def keep_consent(pc: RTCPeerConnection, on_lost: Callable[[ConsentLost], None] | None = None, *,
                 expiry_s: float = CONSENT_EXPIRY_S) -> list[ConsentKeeper]:
    """Our consent keeper on each of ``pc``'s ICE connections (those kept already keep theirs).

    Call it once the remote description is set (the transports are then the ones that connect) and
    before ICE completes; again after a renegotiation. Returns the keepers of all of them.
    """
    keepers = []
    for connection in ice_connections(pc):
        keeper = installed_keeper(connection)
        if keeper is None:
            keeper = ConsentKeeper(connection, on_lost, expiry_s=expiry_s)
            keeper.install()
        keepers.append(keeper)
    return keepers


def installed_keeper(connection: Connection) -> ConsentKeeper | None:
    """The keeper installed on ``connection``, found through the method it replaced: a registry of
    keepers beside the connections would hold each keeper, and through it the connection and its
    whole call, for the life of the process."""
    keeper = getattr(connection.query_consent, "__self__", None)
    return keeper if isinstance(keeper, ConsentKeeper) else None
