"""The loopback server forwards audio as LiveKit's SFU does: each packet as it arrives.

The figures come from the server's own per-packet record (``forwarding()``: when the
publisher's SRTP transport handed a packet over, when it went to each subscriber's), so
a loaded machine does not make them flaky: nothing but the forwarding itself lies
between the two stamps, whatever the load.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import numpy as np
import pytest
from livekit import rtc

from devtools.livekit_server import LoopbackLiveKitServer
from devtools.livekit_server.media_relay import Hop

from .peers import SineFeeder, eventually, inbound_rtp, join

pytestmark = [pytest.mark.asyncio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: The most the server may add to a packet's way, per hop, at the 95th percentile.
HOP_P95_LIMIT_MS = 5.0
PACKET_MS = 20.0  # the SDK's Opus packets
MIC = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)


def hop_ms(hop: Hop) -> float:
    return (hop.sent_ns - hop.arrived_ns) / 1e6


def hops_of(server: LoopbackLiveKitServer, track_sid: str) -> list[Hop]:
    return [h for h in server.forwarding()[1] if h.track_sid == track_sid]


async def publish_pair(server: LoopbackLiveKitServer, rooms: list[rtc.Room], room: str,
                       feeder: SineFeeder) -> str:
    """alice publishes ``feeder`` in ``room``, bob subscribes; the track sid."""
    alice = await join(server, rooms, f"alice-{room}", room)
    await join(server, rooms, f"bob-{room}", room)
    pub = await asyncio.wait_for(alice.local_participant.publish_track(feeder.track, MIC), 60)
    return pub.sid


async def test_added_latency_per_hop_at_16_calls(server: LoopbackLiveKitServer, rooms) -> None:
    calls = 16
    feeders = [SineFeeder().__enter__() for _ in range(calls)]
    try:
        sids: list[str] = []
        for batch in range(0, calls, 4):  # joins four at a time: a loaded machine sets up slowly
            sids += await asyncio.gather(*(publish_pair(server, rooms, f"call-{i}", feeders[i])
                                           for i in range(batch, batch + 4)))
        per_call = 150  # 3 s of 20 ms packets each, all calls at once

        def counts() -> list[int]:
            hops = server.forwarding()[1]
            return [sum(1 for h in hops if h.track_sid == sid) for sid in sids]

        await eventually(lambda: min(counts()) >= per_call, 90)
        hops = [h for h in server.forwarding()[1] if h.track_sid in set(sids)]
    finally:
        for f in feeders:
            f.__exit__()
    latencies = np.array([hop_ms(h) for h in hops])
    p50, p95 = np.percentile(latencies, [50, 95])
    print(f"added latency per hop at {calls} calls: p50 {p50:.2f} ms, p95 {p95:.2f} ms over {len(hops)} packets")
    assert p95 <= HOP_P95_LIMIT_MS, f"hop p50 {p50:.2f} ms, p95 {p95:.2f} ms over {len(hops)} packets"


async def test_a_lost_packet_does_not_hold_the_ones_after_it(server: LoopbackLiveKitServer, rooms) -> None:
    with SineFeeder() as feeder:
        sid = await publish_pair(server, rooms, "loss", feeder)
        await eventually(lambda: len(hops_of(server, sid)) >= 25, 30)
        await server.lose_packets("loss", "alice-loss", 1)
        await eventually(lambda: any(a.lost for a in server.forwarding()[0]), 10)
        lost = next(a for a in server.forwarding()[0] if a.lost)
        await eventually(lambda: sum(1 for h in hops_of(server, sid) if h.arrived_ns > lost.arrived_ns) >= 50, 30)
        bob = next(r for r in rooms if r.local_participant.identity == "bob-loss")
        stats = await bob.get_rtc_stats()
        # The publisher hears of the loss from the server's receiver reports, as from LiveKit's
        # (its encoder's in-band FEC and bitrate follow them).
        alice = next(r for r in rooms if r.local_participant.identity == "alice-loss")
        deadline = time.monotonic() + 10
        while await _reported_lost(alice) < 1:
            assert time.monotonic() < deadline, "no receiver report told alice of her lost packet"
            await asyncio.sleep(0.2)

    arrivals = [a for a in server.forwarding()[0] if a.track_sid == sid]
    hops = {h.sequence_number: h for h in hops_of(server, sid)}
    assert lost.sequence_number not in hops  # the lost one is simply not forwarded
    after = [a for a in arrivals if a.arrived_ns > lost.arrived_ns]
    # Each later packet left before the next one arrived: nothing waited for a newer packet.
    for this, following in zip(after, after[1:]):
        assert hops[this.sequence_number].sent_ns <= following.arrived_ns
    latencies = [hop_ms(hops[a.sequence_number]) for a in after if a.sequence_number in hops]
    assert np.percentile(latencies, 95) <= HOP_P95_LIMIT_MS, latencies
    # The subscriber saw the gap (its sequence numbers carry it), as behind LiveKit's SFU.
    inbound = inbound_rtp(stats)
    assert inbound and inbound[0].received.packets_lost >= 1
    # The summary a failing test prints names the track's publisher and counts the lost one in, not out.
    line = next(row for row in server.forwarding_summary().splitlines() if row.startswith(sid))
    counted = re.fullmatch(rf"{sid} from loss/alice-loss: (\d+) packets in, the last [\d.]+ s ago; "
                           r"(\d+) to bob-loss, the last [\d.]+ s ago \(\d+ held, first [\d.]+ s after subscribing\)", line)
    assert counted and int(counted[1]) > int(counted[2]) >= len(hops), line


async def _reported_lost(publisher: rtc.Room) -> int:
    """How many lost packets the server's receiver reports have told ``publisher`` of."""
    stats = await publisher.get_rtc_stats()
    reports = [s.remote_inbound_rtp for s in stats.publisher_stats if s.WhichOneof("stats") == "remote_inbound_rtp"]
    return max((r.received.packets_lost for r in reports), default=0)


async def test_the_last_packets_before_a_pause_are_forwarded_at_once(server: LoopbackLiveKitServer, rooms) -> None:
    """The SDK's source sends silence while its caller captures nothing, so the pause is
    made at the server's door: from the forwarder's side, a paused publisher is one whose
    packets stop coming (a SIP leg, DTX)."""
    with SineFeeder() as feeder:
        sid = await publish_pair(server, rooms, "pause", feeder)
        await eventually(lambda: len(hops_of(server, sid)) >= 25, 30)
        await server.lose_packets("pause", "alice-pause", 10**9)  # nothing more reaches the forwarder
        await eventually(lambda: any(a.lost for a in server.forwarding()[0]), 10)
        bob = next(r for r in rooms if r.local_participant.identity == "bob-pause")
        forwarded = [a for a in server.forwarding()[0] if a.track_sid == sid and not a.lost]
        tail = forwarded[-1]
        hops = {h.sequence_number: h for h in hops_of(server, sid)}
        assert tail.sequence_number in hops, "the last packet before the pause is still held"
        assert hop_ms(hops[tail.sequence_number]) < PACKET_MS  # a held packet waits for a later one

        async def received() -> int:
            stats = await bob.get_rtc_stats()
            inbound = inbound_rtp(stats)
            return inbound[0].received.packets_received if inbound else 0

        # The subscriber gets every packet that reached the server, the tail too, while the publisher is paused.
        deadline = time.monotonic() + 10
        while (got := await received()) < len(hops):
            assert time.monotonic() < deadline, f"the subscriber has {got} of {len(hops)} forwarded packets"
            await asyncio.sleep(0.1)


async def test_a_quiet_publisher_sends_dtx_unless_its_track_refused_it(server: LoopbackLiveKitServer, rooms) -> None:
    """The server answers a publisher with DTX on, as LiveKit's does: a quiet track sends a packet
    in 200-400 ms; one published with ``dtx=False`` goes on at one every 20 ms, and a loud one
    with DTX on sends every packet."""
    room = await join(server, rooms, "alice-dtx", "dtx")
    options = {"quiet": MIC, "loud": MIC,
               "quiet, dtx refused": rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE, dtx=False)}
    quiet_sources = [rtc.AudioSource(48000, 1) for _ in range(2)]  # nothing captured: the source sends silence
    with SineFeeder() as feeder:
        tracks = {"quiet": rtc.LocalAudioTrack.create_audio_track("quiet", quiet_sources[0]), "loud": feeder.track,
                  "quiet, dtx refused": rtc.LocalAudioTrack.create_audio_track("refused", quiet_sources[1])}
        sids = {}
        for name, track in tracks.items():
            sids[name] = (await asyncio.wait_for(room.local_participant.publish_track(track, options[name]), 60)).sid

        def arrivals(name: str) -> list[int]:
            return [a.arrived_ns for a in server.forwarding()[0] if a.track_sid == sids[name]]

        # A window of 100 packets (2 s) of the track that keeps sending, after its first 50.
        await eventually(lambda: len(arrivals("quiet, dtx refused")) >= 150, 60)
        start, end = arrivals("quiet, dtx refused")[50], arrivals("quiet, dtx refused")[149]
    for source in quiet_sources:
        await source.aclose()
    in_window = {name: sum(1 for t in arrivals(name) if start <= t <= end) for name in sids}
    seconds = (end - start) / 1e9
    print(f"packets over {seconds:.2f} s: {in_window}")
    assert in_window["quiet"] <= seconds * 10, in_window  # DTX: 2.5-5 a second; 50 without
    assert in_window["loud"] >= 75, in_window  # speech is sent whole


class PeersOnTheirOwnLoop:
    """A publisher and a subscriber on a thread and event loop of their own."""

    def __init__(self, server: LoopbackLiveKitServer, room: str) -> None:
        self._server, self._room = server, room
        self.heard_ns: list[int] = []  # when the subscriber got each audio frame (perf_counter_ns)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peers", daemon=True)

    def __enter__(self) -> PeersOnTheirOwnLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported by the test
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        rooms: list[rtc.Room] = []
        try:
            subscribed: asyncio.Future = asyncio.get_running_loop().create_future()
            bob = await join(self._server, rooms, "bob", self._room)
            bob.on("track_subscribed", lambda track, *_: subscribed.done() or subscribed.set_result(track))
            alice = await join(self._server, rooms, "alice", self._room)
            with SineFeeder() as feeder:
                await asyncio.wait_for(alice.local_participant.publish_track(feeder.track, MIC), 20)
                stream = rtc.AudioStream(await asyncio.wait_for(subscribed, 20), sample_rate=48000, num_channels=1)
                try:
                    async for _ in stream:
                        self.heard_ns.append(time.perf_counter_ns())
                        if len(self.heard_ns) == 50:
                            self.ready.set()
                        if self._stop.is_set():
                            return
                finally:
                    await stream.aclose()
        finally:
            for r in rooms:
                await asyncio.wait_for(r.disconnect(), 10)


async def test_forwarding_goes_on_while_the_test_loop_is_blocked(server: LoopbackLiveKitServer) -> None:
    with PeersOnTheirOwnLoop(server, "blocked") as peers:
        await asyncio.to_thread(peers.ready.wait, 60)
        assert peers.error is None and peers.ready.is_set(), peers.error
        start = time.perf_counter_ns()
        time.sleep(1.0)  # this loop stalls, as in a Whisper call on it
        end = time.perf_counter_ns()
    during = [h for h in server.forwarding()[1] if start <= h.sent_ns <= end]
    heard = [t for t in peers.heard_ns if start <= t <= end]
    assert len(during) >= 25, f"{len(during)} packets forwarded in the 1 s the test's loop was blocked"
    assert len(heard) >= 25, f"the subscriber got {len(heard)} frames in that second"


async def test_red_rebuilds_a_lost_packets_frame_at_the_subscriber(server: LoopbackLiveKitServer, rooms) -> None:
    """The server answers a publisher with RED first and forwards RED to a subscriber that takes
    it, as LiveKit's does: a packet lost on the way in is rebuilt from the copy the next one
    carries, so the subscriber conceals next to nothing. The same losses on a track published
    with ``red=False`` are each concealed."""
    losses = 20
    concealment_events = {}
    for red in (True, False):
        room = f"red-{red}".lower()
        alice = await join(server, rooms, f"alice-{room}", room)
        bob = await join(server, rooms, f"bob-{room}", room)
        subscribed = asyncio.get_running_loop().create_future()
        bob.on("track_subscribed", lambda track, *_: subscribed.done() or subscribed.set_result(track))  # noqa: B023 (called within this iteration)
        with SineFeeder() as feeder:
            options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE, red=red)
            sid = (await asyncio.wait_for(alice.local_participant.publish_track(feeder.track, options), 60)).sid
            # Bob plays the track out, as a caller or the worker does: concealment happens at playout.
            stream = rtc.AudioStream(await asyncio.wait_for(subscribed, 30), sample_rate=48000, num_channels=1)
            playout = asyncio.create_task(_drain(stream))
            await eventually(lambda: len(hops_of(server, sid)) >= 50, 30)  # noqa: B023 (called within this iteration)
            for _ in range(losses):  # one packet in every ten lost on alice's uplink
                forwarded = len(hops_of(server, sid))
                await server.lose_packets(room, f"alice-{room}", 1)
                await eventually(lambda: len(hops_of(server, sid)) >= forwarded + 10, 10)  # noqa: B023 (called within this iteration)
            forwarded = len(hops_of(server, sid))
            await eventually(lambda: len(hops_of(server, sid)) >= forwarded + 25, 10)  # past the jitter buffer  # noqa: B023 (called within this iteration)
            stats = await bob.get_rtc_stats()
            playout.cancel()
        inbound = inbound_rtp(stats)
        assert inbound and inbound[0].received.packets_lost >= losses  # the losses reached bob as gaps
        concealment_events[red] = inbound[0].inbound.concealment_events
        arrivals = [a for a in server.forwarding()[0] if a.track_sid == sid]
        assert sum(a.lost for a in arrivals) == losses and all(a.red == red for a in arrivals)
    print(f"concealment events at bob for {losses} lost packets: {concealment_events}")
    assert concealment_events[False] >= losses // 2, concealment_events  # each loss concealed (~20)
    assert concealment_events[True] < losses // 2, concealment_events  # rebuilt from RED (~1, at the start)


async def _drain(stream: rtc.AudioStream) -> None:
    async for _ in stream:
        pass
