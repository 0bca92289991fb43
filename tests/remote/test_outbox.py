"""The sent log: receipts around what is written, and what a resume sends again (agent/remote/outbox.py)."""

from __future__ import annotations

import json

import pytest

from duplex_agent.agent.remote.outbox import Outgoing, Role, SentLog


def _write(log: SentLog, items: list[Outgoing]) -> list[Outgoing]:
    """What the writer puts on the socket for ``items``, receipts included, in order."""
    wire: list[Outgoing] = []
    for item in items:
        if (before := log.receipt_before(item)) is not None:
            wire.append(before)
            log.written(before)
        wire.append(item)
        if (after := log.written(item)) is not None:
            wire.append(after)
            log.written(after)
    return wire


def _call() -> list[Outgoing]:
    audio = [Outgoing(f"append-{i}", 40.0) for i in range(8)]
    return [*audio[:6], Outgoing("commit"), Outgoing("event-ack", role=Role.TRANSPORT), *audio[6:],
            Outgoing("playback.ack"), Outgoing("response.create")]


def test_receipts_go_around_control_messages_and_after_every_stretch_of_audio():
    wire = _write(SentLog(receipt_every_ms=100.0), _call())
    names = ["R" if item.role is Role.RECEIPT else item.text for item in wire]
    assert names == ["append-0", "append-1", "append-2", "R", "append-3", "append-4", "append-5", "R", "commit", "R",
                     "event-ack", "append-6", "append-7", "R", "playback.ack", "R", "response.create", "R"]
    receipts = [json.loads(item.text) for item in wire if item.role is Role.RECEIPT]
    assert {r["type"] for r in receipts} == {"session.heartbeat"}
    assert len({r["event_id"] for r in receipts}) == len(receipts)


def test_each_answer_covers_up_to_the_oldest_receipt_and_an_answer_without_one_changes_nothing():
    log = SentLog(receipt_every_ms=100.0)
    _write(log, _call())
    assert len(log) == 18
    assert log.received() and len(log) == 14
    for _ in range(5):
        assert log.received()
    assert len(log) == 0
    assert not log.received()
    _write(log, [Outgoing("append", 40.0)])
    assert not log.received() and len(log) == 1  # no receipt written yet: nothing is covered


@pytest.mark.parametrize("delivered", range(19))
def test_after_a_resume_what_the_server_lacks_goes_again_once_in_order(delivered):
    """The socket dies after ``delivered`` wire messages reached the server, at every point of a call."""
    log = SentLog(receipt_every_ms=100.0)
    wire = _write(log, _call())
    got = wire[:delivered]
    for item in got:
        if item.role is Role.RECEIPT:
            assert log.received()  # the server answered it (live or in the resume's replay)
    resend = log.after_resume()

    sent_once = [item for item in _call() if item.role is not Role.TRANSPORT]
    at_server = [item for item in got if item.role in (Role.AUDIO, Role.CONTROL)]
    # The server ends up with every message, in order, except audio of unknown fate, which is
    # counted; a control message of unknown fate goes again (the one case that can repeat).
    merged = at_server + [item for item in resend if not (at_server and item is at_server[-1])]
    missing = [item for item in sent_once if item not in merged]
    assert all(item.role is Role.AUDIO for item in missing)
    assert [item for item in sent_once if item not in missing] == merged
    # What is counted is all the audio of unknown fate (some of it may have arrived): at most the
    # stretch between two receipts, which ends at the first append reaching 100 ms.
    assert sum(item.audio_ms for item in missing) <= log.dropped_audio_ms <= 120.0
    repeated = [item for item in resend if item in at_server]
    assert len(repeated) <= 1 and all(item.role is Role.CONTROL for item in repeated)
    assert not [item for item in resend if item.role in (Role.RECEIPT, Role.TRANSPORT)]
    assert len(log) == 0 and log.resent == len(resend)
