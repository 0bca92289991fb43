"""The forwarder between two namespaces: UDP sent from the caller's side to the worker's,
with what the receiver got compared against what the forwarder says it did."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from devtools.netem import TO_WORKER, GilbertElliott, ImpairedLink, Impairment, socket_in
from devtools.netem.link import PREFIX
from devtools.netem.namespaces import namespaces

PORT = 9000
SO_RCVBUFFORCE = 33  # Linux; the socket module does not name it


def send_and_receive(link: ImpairedLink, count: int | None, spacing_s: float = 0.002, after: int = 100) -> list[int]:
    """``count`` numbered datagrams caller -> worker, ``spacing_s`` apart (with ``count`` None: until
    UDP flows again after a blackout, then ``after`` more); the numbers received, in order."""
    rx = socket_in(link.namespace["worker"])
    # Room for every datagram even when this machine is too busy to run the reader for a while.
    rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
    rx.bind((link.address["worker"], PORT))
    rx.settimeout(1.0)
    tx = socket_in(link.namespace["caller"])
    got: list[int] = []

    def receive() -> None:
        try:
            while True:
                got.append(int.from_bytes(rx.recv(64), "big"))
        except TimeoutError:
            pass

    reader = threading.Thread(target=receive)
    reader.start()
    start, i, left = time.monotonic(), 0, count
    while left is None or left > 0:
        tx.sendto(i.to_bytes(4, "big"), (link.address["worker"], PORT))
        i += 1
        if left is None:
            left = after if link.forwarder.flowing_again(TO_WORKER) else None
        else:
            left -= 1
        time.sleep(max(0.0, start + i * spacing_s - time.monotonic()))
    reader.join()
    rx.close()
    tx.close()
    return got


def late_arrivals(got: list[int]) -> int:
    """Datagrams that arrived after one sent later than them (the forwarder's own definition)."""
    latest, late = -1, 0
    for n in got:
        late += n < latest
        latest = max(latest, n)
    return late


def test_a_clean_link_passes_everything_in_order():
    with ImpairedLink(seed=1) as link:
        got = send_and_receive(link, 500)
        counts = link.counts()[TO_WORKER]
    assert got == list(range(500))
    assert counts.udp_in == 500 and counts.delivered == 500 and counts.dropped == 0 and counts.reordered == 0


def test_random_loss_is_near_its_rate_and_equal_to_the_count():
    with ImpairedLink(to_worker=Impairment(loss=0.1), seed=7) as link:
        got = send_and_receive(link, 2000)
        counts = link.counts()[TO_WORKER]
    lost = 2000 - len(got)
    assert lost == counts.dropped_random == counts.dropped
    assert 0.08 < lost / 2000 < 0.12
    assert got == sorted(got)  # loss alone never reorders


def test_jitter_reorders_and_the_count_matches_what_arrived():
    with ImpairedLink(to_worker=Impairment(delay_ms=40, jitter_ms=15), seed=3) as link:
        got = send_and_receive(link, 600, spacing_s=0.005)
        counts = link.counts()[TO_WORKER]
    assert sorted(got) == list(range(600))  # delayed, none lost
    assert counts.delayed == 600
    assert late_arrivals(got) == counts.reordered > 0


def test_burst_loss_loses_runs_of_packets():
    bursts = GilbertElliott(p=0.005, r=0.1, max_bad=20)
    with ImpairedLink(to_worker=Impairment(bursts=bursts), seed=5) as link:
        got = send_and_receive(link, 3000, spacing_s=0.001)
        counts = link.counts()[TO_WORKER]
    missing = sorted(set(range(3000)) - set(got))
    runs, run = [], 1
    for a, b in zip(missing, missing[1:]):
        if b == a + 1:
            run += 1
        else:
            runs.append(run)
            run = 1
    runs.append(run)
    assert len(missing) == counts.dropped_burst == counts.dropped
    assert 0.01 < len(missing) / 3000 < 0.12
    assert 20 >= max(runs) == counts.longest_loss_run >= 5


def test_a_blackout_drops_everything_for_its_length():
    with ImpairedLink(seed=2) as link:
        link.blackout(0.5)
        got = send_and_receive(link, None)
        counts = link.counts()[TO_WORKER]
        span = link.blackout_drop_span(TO_WORKER)
    # Everything sent during the blackout is gone, everything after it arrives.
    assert len(got) >= 100 and got == list(range(got[0], counts.udp_in))
    assert counts.dropped_blackout == got[0] == counts.dropped > 0
    assert 0 < span < 0.5  # the drops lie inside the blackout


def test_nothing_is_left_behind_even_when_the_body_raises():
    with pytest.raises(RuntimeError, match="the body failed"), ImpairedLink(seed=1) as link:
        names = set(link.namespace.values())
        assert names <= set(namespaces())
        sleeper = subprocess.Popen([*link.exec_prefix("worker"), "sleep", "60"])
        raise RuntimeError("the body failed")
    assert not names & set(namespaces())
    assert sleeper.wait(timeout=10) != 0  # ended by the link, not left running
    assert not any(t.name == "netem-forwarder" for t in threading.enumerate())


def test_stale_namespaces_of_a_dead_process_are_removed():
    stale = f"{PREFIX}999999999-0-caller"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with ImpairedLink(seed=1):
            assert stale not in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
