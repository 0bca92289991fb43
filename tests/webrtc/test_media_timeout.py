"""The direct call's media timeout: the timer alone on a real loop (packets keep it, a stalled loop
does not trip it), then a real aiortc caller that stops sending: the page is told why and the
call ends, counted in /metrics; the setting as a flag and a variable."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from duplex_agent.agent.app.cli import PluginOptions, build_parser
from duplex_agent.agent.app.settings import Settings
from duplex_agent.webrtc.direct.media_timeout import MediaWatchdog
from duplex_agent.webrtc.direct.peer_session import DEFAULT_MEDIA_TIMEOUT_S
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS, register_webrtc_routes
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend
from .test_caller_receive import PausingTrack, _sample, serve_with

TIMEOUT_S = 1.0


class Packets:
    """A caller's packet clock for the watchdog: ``last`` is the loop time of its latest packet."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.timed_out_at: float | None = None
        self.fired = asyncio.Event()
        self.timeouts = 0

    def arrive(self) -> None:
        self.last = asyncio.get_running_loop().time()

    def timed_out(self) -> None:
        self.timed_out_at = asyncio.get_running_loop().time()
        self.timeouts += 1
        self.fired.set()

    async def send_for(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            self.arrive()
            await asyncio.sleep(0.02)


async def timed_out_alongside() -> None:
    """Wait until a watchdog started now, whose caller sends nothing, has timed out: by then any
    watchdog started no later would have too."""
    reference = Packets()
    MediaWatchdog(TIMEOUT_S, lambda: None, reference.timed_out).start()
    await asyncio.wait_for(reference.fired.wait(), 10)


async def test_packets_keep_the_call_and_their_absence_ends_it_once():
    packets = Packets()
    watchdog = MediaWatchdog(TIMEOUT_S, lambda: packets.last, packets.timed_out)
    watchdog.start()
    await packets.send_for(4 * TIMEOUT_S)  # four timeouts' worth, every one kept by a packet
    assert not packets.fired.is_set()
    stopped_at = packets.last
    await asyncio.wait_for(packets.fired.wait(), 10)
    assert packets.timed_out_at - stopped_at >= TIMEOUT_S
    assert watchdog.timed_out
    watchdog.start()  # a timed-out watchdog stays so: one hang-up per call
    await timed_out_alongside()
    assert packets.timeouts == 1


async def test_no_packet_at_all_counts_from_the_start():
    packets = Packets()
    watchdog = MediaWatchdog(TIMEOUT_S, lambda: packets.last, packets.timed_out)
    started = asyncio.get_running_loop().time()
    watchdog.start()
    await asyncio.wait_for(packets.fired.wait(), 10)
    assert packets.timed_out_at - started >= TIMEOUT_S


async def test_a_loop_held_up_past_the_timeout_is_not_a_caller_that_stopped():
    packets = Packets()
    watchdog = MediaWatchdog(TIMEOUT_S, lambda: packets.last, packets.timed_out)
    watchdog.start()
    await packets.send_for(0.1)
    loop = asyncio.get_running_loop()
    stalled = asyncio.Event()

    def stall() -> None:
        time.sleep(2 * TIMEOUT_S)  # the loop is held up; the caller's packets queue meanwhile
        loop.call_soon(packets.arrive)  # and are read right after, as the socket's backlog is
        loop.call_soon(stalled.set)

    loop.call_soon(stall)
    await stalled.wait()
    await packets.send_for(2 * TIMEOUT_S)
    assert not packets.fired.is_set()  # the stall did not end the call
    await asyncio.wait_for(packets.fired.wait(), 10)
    watchdog.close()


async def test_a_closed_watchdog_never_fires():
    packets = Packets()
    watchdog = MediaWatchdog(TIMEOUT_S, lambda: packets.last, packets.timed_out)
    watchdog.start()
    watchdog.close()
    await timed_out_alongside()
    assert not packets.fired.is_set()


async def test_a_caller_that_stops_sending_is_told_why_and_the_call_ends(host_address):
    backend = EchoBackend()
    http, app = await serve_with(backend, host_address, media_timeout_s=2.0)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))
    track = PausingTrack(frames_of(tone(30000, rate=48000)), before=50, pause_s=60.0)  # stops after a second
    client.pc.getSenders()[0].replaceTrack(track)
    before = _sample("duplex_errors_total", code="media_timeout") or 0.0
    try:
        await client.connect(http)
        await until(lambda: "session.closed" in client.message_types(), 30, "the worker to end the call")
        errors = [m["error"] for m in client.messages if m.get("type") == "error"]
        assert [e["code"] for e in errors] == ["media_timeout"] and "2 s" in errors[0]["message"]
        closed = [m for m in client.messages if m.get("type") == "session.closed"]
        assert closed == [{"type": "session.closed", "reason": "media_timeout"}]
        assert track.sent == 50  # it stopped, and was not heard again
        await until(lambda: client.pc_id not in app[WEBRTC_PEERS].sessions, 10, "the peer to go")
        await until(lambda: backend.conversations[0].closed_reason is not None, 10, "the conversation to close")
        assert backend.conversations[0].closed_reason == "media_timeout"
        assert _sample("duplex_errors_total", code="media_timeout") == before + 1
    finally:
        await client.close()
        await http.close()


def test_the_media_timeout_setting():
    assert Settings().media_timeout == DEFAULT_MEDIA_TIMEOUT_S == 20.0
    assert Settings.from_env({"DUPLEX_MEDIA_TIMEOUT": "0"}).media_timeout == 0.0
    settings = Settings()
    parser = build_parser(settings, PluginOptions(settings))
    assert settings.apply(parser.parse_args(["serve", "--media-timeout", "7.5"])).media_timeout == 7.5
    with pytest.raises(ValueError, match="media_timeout must be 0"):
        register_webrtc_routes(web.Application(), EchoBackend(), host_address="192.0.2.1", media_timeout_s=-1)
