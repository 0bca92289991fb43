"""A whole direct-WebRTC call through the impaired link: the real worker (reference model,
echo responder) in one namespace, a real aiortc caller in the other, only the forwarder
between them. One worker and one caller program serve the module; each test is a new call."""

from __future__ import annotations

import pytest

from devtools.netem import ImpairedLink, Impairment
from devtools.netem.calls import (
    CallerProcess,
    recall,
    receive_figures,
    start_worker,
    write_clips,
)
from devtools.speech import speak

QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")
STOP = "Wait, stop please."
#: 3 of 4 content words: the bar for "the worker heard the question".
HEARD = 0.75
LOSSY = Impairment(loss=0.03, delay_ms=40, jitter_ms=15)


@pytest.fixture(scope="module")
def call_rig(tmp_path_factory):
    folder = tmp_path_factory.mktemp("netem-call")
    clips = write_clips(folder / "clips", speak(QUESTION, 48000, before_ms=300, after_ms=1200),
                        speak(LONG, 48000, before_ms=300, after_ms=800), speak(STOP, 48000, after_ms=100))
    with ImpairedLink(seed=11) as link, open(folder / "worker.log", "w") as worker_log, \
            open(folder / "caller.log", "w") as caller_log:
        worker = start_worker(link, worker_log)
        with CallerProcess(link, clips, caller_log) as caller:
            yield link, caller, worker
        # Logs stay in the test's tmp folder when something needs explaining.


def connect(caller: CallerProcess, worker) -> None:  # noqa: ANN001
    answer = caller.step("connect")
    assert answer["ok"], (answer, "worker exit code", worker.poll())


def assert_heard_and_stoppable(caller: CallerProcess, link: ImpairedLink) -> None:
    turn = caller.step("turn")
    # What the worker's receive buffer did with the caller's packets, to explain a failure.
    figures = receive_figures(link)
    assert turn["ok"] and turn["turn_ms"] is not None, (turn, figures)
    barge = caller.step("barge_in")
    assert barge["ok"] and barge["stopped"], barge
    assert recall(QUESTION, turn["heard"]) >= HEARD, (turn, figures)


def test_a_call_on_a_clean_network(call_rig):
    link, caller, worker = call_rig
    link.impair()
    before = link.counts()
    connect(caller, worker)
    assert_heard_and_stoppable(caller, link)
    caller.step("hangup")
    after = link.counts()
    for direction, counts in after.items():
        assert counts.udp_in > before[direction].udp_in + 200  # the call's media went through the forwarder
        assert counts.dropped == before[direction].dropped


def test_a_call_at_3_percent_loss_with_40_15_ms_jitter(call_rig):
    link, caller, worker = call_rig
    link.impair(to_worker=LOSSY, to_caller=LOSSY)
    before = link.counts()
    try:
        connect(caller, worker)
        assert_heard_and_stoppable(caller, link)
    finally:
        caller.step("hangup")
        link.impair()
    after = link.counts()
    for direction, counts in after.items():
        assert counts.dropped > before[direction].dropped and counts.reordered > before[direction].reordered


def test_a_call_survives_3_s_without_packets(call_rig):
    """What the worker does today: nothing times out in 3 s (ICE consent and the data channel's
    SCTP ride it out), so the call carries on when packets return."""
    link, caller, worker = call_rig
    link.impair()
    connect(caller, worker)
    try:
        link.blackout(3.0)
        assert link.wait_flowing(30), "no packets both ways after the blackout"
        # The caller's packets were stopped for the whole 3 s. Not a count of them: a caller on a
        # loaded machine sends fewer than 50 a second (its clock skips its loop's stalls).
        assert link.blackout_drop_span("to_worker") > 2.0  # (a loaded caller may stall at either end)
        assert_heard_and_stoppable(caller, link)
        state = caller.step("state")
        assert state["connection"] == "connected" and state["channel"] == "open", state
    finally:
        caller.step("hangup")
