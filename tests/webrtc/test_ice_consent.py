"""ICE consent freshness (webrtc/direct/ice_consent.py) on two real aioice connections over the host's
address, with short timings: answers held up by a stalled loop keep consent where aioice's own checks
lose it; a peer that stops answering, or revokes consent, ends it once, with a reason; then a real
aiortc caller against the worker's signaling, where only the call that stopped answering ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aioice.ice
import pytest
from aioice import Connection, ConnectionClosed, stun

from duplex_agent.webrtc.direct import ice_consent
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.ice_consent import (
    CHECK_INTERVAL_S,
    CONSENT_EXPIRED,
    CONSENT_EXPIRY_S,
    CONSENT_REVOKED,
    ConsentKeeper,
    ConsentLost,
)
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend
from .test_caller_receive import _sample, serve_with

EXPIRY_S = 2.0  # checks every 0.33 s
#: Longer than aioice's wait for an answer (0.5 s), so that each of its checks fails.
LATE_S = 0.7


class Pair:
    """Two aioice connections, ``a`` controlling; ``keepers`` are ours where the test asked."""

    def __init__(self, keep: bool, on_lost: Callable[[ConsentLost], None] | None = None) -> None:
        self.a = Connection(ice_controlling=True, components=1, use_ipv6=False)
        self.b = Connection(ice_controlling=False, components=1, use_ipv6=False)
        self.keepers: list[ConsentKeeper] = []
        if keep:
            self.keepers = [ConsentKeeper(self.a, on_lost, expiry_s=EXPIRY_S), ConsentKeeper(self.b, expiry_s=EXPIRY_S)]
            for keeper in self.keepers:
                keeper.install()
        self.a_closed: asyncio.Task | None = None

    async def connect(self, address: str) -> Pair:
        with candidates_on(address):
            await asyncio.gather(self.a.gather_candidates(), self.b.gather_candidates())
        for here, there in ((self.a, self.b), (self.b, self.a)):
            here.remote_username, here.remote_password = there.local_username, there.local_password
            for candidate in there.local_candidates:
                await here.add_remote_candidate(candidate)
            await here.add_remote_candidate(None)
        await asyncio.gather(self.a.connect(), self.b.connect())
        self.a_closed = asyncio.create_task(self.a.get_event())
        return self

    def answer_late(self, seconds: float, counted: list[float]) -> None:
        """``b`` answers each of ``a``'s checks ``seconds`` late, as a peer whose loop is starved does,
        while this loop runs on."""
        answer = self.b.request_received
        loop = asyncio.get_running_loop()

        def later(*args: object) -> None:
            counted.append(loop.time())
            loop.call_later(seconds, answer, *args)

        self.b.request_received = later

    async def close(self) -> None:
        await asyncio.gather(self.a.close(), self.b.close())
        if self.a_closed is not None:
            await self.a_closed


@pytest.fixture
async def pairs():
    made: list[Pair] = []
    yield made
    for pair in made:
        await pair.close()


def test_the_rfc_figures_are_the_defaults():
    assert (CONSENT_EXPIRY_S, CHECK_INTERVAL_S) == (30.0, 5.0)
    keeper = ConsentKeeper(Connection(ice_controlling=True))
    assert (keeper.expiry_s, keeper.interval_s) == (30.0, 5.0)
    with pytest.raises(ValueError):
        ConsentKeeper(Connection(ice_controlling=True), expiry_s=31.0)  # the RFC's 30 s is a ceiling


async def test_answers_held_up_by_the_peers_loop_keep_consent(host_address, pairs):
    lost: list[ConsentLost] = []
    pair = await Pair(keep=True, on_lost=lost.append).connect(host_address)
    pairs.append(pair)
    keeper = pair.keepers[0]
    late: list[float] = []
    answers = keeper.answers
    pair.answer_late(LATE_S, late)
    await until(lambda: late and late[-1] - late[0] > 2 * EXPIRY_S, 30, "late answers for two expiries")
    assert keeper.answers >= answers + len(late) - 3  # (the last checks' answers are on their way)
    assert not lost and keeper.lost is None and not pair.a_closed.done()


async def test_the_same_late_answers_end_aioices_own_consent(host_address, pairs, monkeypatch):
    """The fault the keeper removes: aioice drops an answer later than 0.5 s, and six such end the connection."""
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.3)  # its checks come faster; its judgment is the same
    pair = await Pair(keep=False).connect(host_address)
    pairs.append(pair)
    late: list[float] = []
    pair.answer_late(LATE_S, late)
    await until(lambda: pair.a_closed.done(), 30, "aioice to close the connection")
    assert isinstance(pair.a_closed.result(), ConnectionClosed)
    assert len(late) >= 6


async def test_a_loop_held_up_past_the_expiry_is_not_a_peer_that_stopped(host_address, pairs):
    lost: list[ConsentLost] = []
    pair = await Pair(keep=True, on_lost=lost.append).connect(host_address)
    pairs.append(pair)
    keeper = pair.keepers[0]
    await until(lambda: keeper.answers >= 1, 10, "a first answer")
    time.sleep(2.5 * EXPIRY_S)  # nothing can answer meanwhile, and nothing is read
    answers = keeper.answers
    await until(lambda: keeper.answers > answers, 10, "an answer after the stall")
    assert not lost and not pair.a_closed.done()


async def test_a_peer_that_stops_answering_loses_consent_once_after_the_expiry(host_address, pairs):
    lost: list[tuple[float, ConsentLost]] = []
    loop = asyncio.get_running_loop()
    pair = await Pair(keep=True, on_lost=lambda e: lost.append((loop.time(), e))).connect(host_address)
    pairs.append(pair)
    keeper = pair.keepers[0]
    await until(lambda: keeper.answers >= 2, 10, "answers while the peer answers")
    protocol = pair.a._nominated[1].protocol
    pair.b.request_received = lambda *args: None  # b hears a's checks no more (its own still go out)
    answers, stopped_at = keeper.answers, loop.time()
    await until(lambda: pair.a_closed.done(), 10, "the connection to close for lost consent")
    assert isinstance(pair.a_closed.result(), ConnectionClosed)
    assert len(lost) == 1 and lost[0][1].code == CONSENT_EXPIRED and "2 s" in str(lost[0][1])
    assert lost[0][0] - stopped_at >= EXPIRY_S - keeper.interval_s * 1.2  # from the last answer, not sooner
    assert keeper.answers <= answers + 1  # (one answer may have been on its way)
    assert keeper.checks_sent > answers + 2  # the checks went on, unanswered
    assert not any(isinstance(t, ice_consent._Check) for t in protocol.transactions.values())  # discarded


async def test_an_authenticated_403_revokes_consent_and_nothing_else_does(host_address, pairs):
    lost: list[ConsentLost] = []
    pair = await Pair(keep=True, on_lost=lost.append).connect(host_address)
    pairs.append(pair)
    keeper = pair.keepers[0]
    pair.b.request_received = lambda *args: None  # the checks stay open for the test to answer
    await until(lambda: keeper._open, 10, "a check awaiting its answer")
    nominated = pair.a._nominated[1]
    transaction_id = next(iter(keeper._open))

    def forbidden(key: str | None) -> bytes:
        message = stun.Message(stun.Method.BINDING, stun.Class.ERROR, transaction_id=transaction_id)
        message.attributes["ERROR-CODE"] = (403, "Forbidden")
        if key is not None:
            message.add_message_integrity(key.encode())
        return bytes(message)

    nominated.protocol.datagram_received(forbidden(None), nominated.remote_addr)  # not signed
    nominated.protocol.datagram_received(forbidden(pair.b.local_password), ("192.0.2.1", 9))  # not from the peer
    nominated.protocol.datagram_received(forbidden(pair.a.local_password), nominated.remote_addr)  # wrong key
    assert not lost and transaction_id in keeper._open
    nominated.protocol.datagram_received(forbidden(pair.b.local_password), nominated.remote_addr)
    assert [e.code for e in lost] == [CONSENT_REVOKED]
    await until(lambda: pair.a_closed.done(), 10, "the connection to close at once")


async def test_a_caller_that_stops_answering_consent_checks_ends_its_own_call_with_that_reason(host_address):
    """Its media keeps coming (which is not consent); the worker ends that call, says why, counts it; the
    other caller's call goes on."""
    backend = EchoBackend()
    http, app = await serve_with(backend, host_address, consent_expiry_s=EXPIRY_S)
    silent = ClientPeer(host_address, frames_of(tone(60000, rate=48000)))
    other = ClientPeer(host_address, frames_of(tone(60000, rate=48000)))
    before = _sample("duplex_errors_total", code=CONSENT_EXPIRED) or 0.0
    try:
        await silent.connect(http)
        await other.connect(http)
        sessions = app[WEBRTC_PEERS].sessions
        watched = sessions[silent.pc_id].consent
        await until(lambda: watched and all(k.answers >= 2 for k in watched), 20, "the worker's checks answered")
        for keeper in ice_consent.keep_consent(silent.pc):  # the caller's connections (kept already)
            keeper.connection.request_received = lambda *args: None
        errors = lambda: [m["error"]["code"] for m in silent.messages if m.get("type") == "error"]  # noqa: E731
        await until(errors, 20, "the reason, on the data channel (which still reaches the caller)")
        assert errors() == [CONSENT_EXPIRED]
        await until(lambda: silent.pc_id not in sessions, 20, "the worker to end the silent caller's call")
        assert _sample("duplex_errors_total", code=CONSENT_EXPIRED) == before + 1
        await until(lambda: backend.conversations[0].closed_reason is not None, 10, "its conversation to close")
        assert backend.conversations[0].closed_reason == CONSENT_EXPIRED
        heard = other.loud_frames()
        await until(lambda: other.loud_frames() > heard + 50, 20, "the other call's audio, still flowing")
        assert other.pc_id in sessions and sessions[other.pc_id].consent[0].lost is None
    finally:
        await silent.close()
        await other.close()
        await http.close()
