"""bench.lossy_network's LiveKit column: the words the worker heard of all the caller's turns."""

from __future__ import annotations

from devtools.netem.calls import recall_of_turns


def test_each_heard_word_counts_for_one_said_word() -> None:
    said = ["Where is the station?", "Wait, stop. Where is the station?"]  # 6 content words
    heard = ["Where is the station?", "Wait stop. Where is the nation?"]  # "station" once for the two said
    assert recall_of_turns(said, heard) == (5 / 6, 6)


def test_nothing_heard_is_nothing_and_nothing_said_is_all() -> None:
    assert recall_of_turns(["Can you help me?"], []) == (0.0, 2)
    assert recall_of_turns([], ["anything"]) == (1.0, 0)
