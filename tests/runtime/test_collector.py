"""The worker's garbage collector: what started is left out of collections, and what a finished
call left in reference cycles is freed (with what its finalizers release) after the call."""

from __future__ import annotations

import gc
import weakref

from duplex_agent.agent.app.collector import collect_after_call, freeze_what_started


class _Handle:
    """Stands for an SDK object whose finalizer releases a native resource."""

    def __init__(self, released: list[str], name: str) -> None:
        self.peer: _Handle | None = None
        weakref.finalize(self, released.append, name)


def test_a_finished_calls_cycles_are_freed_and_what_started_stays_out_of_collections():
    try:
        started = _Handle([], "started")
        freeze_what_started()
        assert gc.get_freeze_count() > 0
        assert all(obj is not started for obj in gc.get_objects())  # frozen: no collection scans it

        released: list[str] = []
        room, participant = _Handle(released, "room"), _Handle(released, "participant")
        room.peer, participant.peer = participant, room  # a cycle, as a Room and its participant make
        gc.disable()  # no collection of its own in between
        try:
            del room, participant
            assert released == []
            assert collect_after_call() >= 2
        finally:
            gc.enable()
        assert sorted(released) == ["participant", "room"]
    finally:
        gc.unfreeze()
