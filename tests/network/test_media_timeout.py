"""The media timeout through the impaired link: a worker with a short ``--media-timeout`` keeps a
call whose packets stop for less than it, and ends one whose packets stay away longer, for the
reason ``media_timeout``, counted in its /metrics. (That the caller is told the reason on its
data channel when its sender stops: tests/webrtc/test_media_timeout.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from devtools.netem import ImpairedLink
from devtools.netem.calls import CallerProcess, start_worker, worker_url, write_clips
from devtools.speech import speak

from .test_direct_call import LONG, QUESTION, STOP, assert_heard_and_stoppable, connect

#: Short, for the test; still a few times the 2 s blackout, so a loaded worker's stalls cannot end that call.
TIMEOUT_S = 6
BLACKOUT_S = 2.0


@pytest.fixture(scope="module")
def call_rig(tmp_path_factory):
    folder = tmp_path_factory.mktemp("netem-timeout")
    clips = write_clips(folder / "clips", speak(QUESTION, 48000, before_ms=300, after_ms=1200),
                        speak(LONG, 48000, before_ms=300, after_ms=800), speak(STOP, 48000, after_ms=100))
    with ImpairedLink(seed=13) as link, open(folder / "worker.log", "w") as worker_log, \
            open(folder / "caller.log", "w") as caller_log:
        worker = start_worker(link, worker_log, None, "--media-timeout", str(TIMEOUT_S))
        with CallerProcess(link, clips, caller_log) as caller:
            yield link, caller, worker


def worker_page(link: ImpairedLink, path: str) -> str:
    fetch = ("import sys, urllib.request; "
             "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())")
    done = subprocess.run([*link.exec_prefix("worker"), sys.executable, "-c", fetch, worker_url(link) + path],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def media_timeouts(link: ImpairedLink) -> float:
    match = re.search(r'^duplex_errors_total\{code="media_timeout"\} (\S+)$', worker_page(link, "/metrics"), re.M)
    return float(match[1]) if match else 0.0


def test_a_blackout_shorter_than_the_media_timeout_keeps_the_call(call_rig):
    link, caller, worker = call_rig
    link.impair()
    connect(caller, worker)  # (it waits until the worker serves)
    before = media_timeouts(link)
    try:
        link.blackout(BLACKOUT_S)
        assert link.wait_flowing(30), "no packets both ways after the blackout"
        assert link.blackout_drop_span("to_worker") > BLACKOUT_S - 1  # the caller's packets were stopped
        assert_heard_and_stoppable(caller, link)
        state = caller.step("state")
        assert state["connection"] == "connected" and state["channel"] == "open", state
        assert media_timeouts(link) == before
    finally:
        caller.step("hangup")


def test_a_blackout_longer_than_the_media_timeout_ends_the_call_with_that_reason(call_rig):
    """The worker ends the call and counts why. The caller cannot be told while the network is gone:
    the reason waits in SCTP for acks that cannot come, and the worker's close aborts it."""
    link, caller, worker = call_rig
    link.impair()
    connect(caller, worker)  # (it waits until the worker serves)
    before = media_timeouts(link)
    try:
        started = time.monotonic()
        link.blackout(2 * TIMEOUT_S)
        deadline = started + 30
        while media_timeouts(link) == before and time.monotonic() < deadline:
            time.sleep(0.2)  # the worker's /metrics, read inside its namespace (the blackout is on the link)
        ended_after = time.monotonic() - started
        assert media_timeouts(link) == before + 1, "the worker did not end the call for its media timeout"
        assert ended_after > TIMEOUT_S - 1  # not before the caller's packets had been away that long
        deadline = time.monotonic() + 30
        while (sessions := json.loads(worker_page(link, "/healthz"))["sessions"]) and time.monotonic() < deadline:
            time.sleep(0.2)  # the conversation closes just after the peer
        assert sessions == 0, "the timed-out call still holds its conversation"
    finally:
        caller.step("hangup")
