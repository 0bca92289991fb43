"""The figures of ``bench.tool_overhead``, from constructed turns: the tool's run comes out, the
floor turn is what is beyond, and turns that did not go as their kind says are not counted."""

from bench.report import Report
from bench.tool_overhead import Turn, order, report


def turn(path: str, kind: str, waited: float | None, *, run: float | None = None, between: float | None = None,
         transcript: str = "Sunny in Paris.") -> Turn:
    return Turn(path, kind, waited_ms=waited, tool_run_ms=run, first_round_ms=400.0, between_rounds_ms=between,
                to_sound_ms=300.0, transcript=transcript)


def test_the_overhead_is_the_tool_turn_less_its_run_beyond_the_floor_turn():
    turns = [turn("in-process", "tool", 1300.0, run=200.0, between=250.0),
             turn("in-process", "tool", 1500.0, run=300.0, between=340.0),
             turn("in-process", "floor", 1000.0), turn("in-process", "floor", 1100.0),
             turn("in-process", "floor", None),  # unanswered
             turn("in-process", "tool", 900.0, run=None),  # no tool ran: not a tool turn
             turn("remote", "tool", 1400.0, run=200.0, between=260.0),
             turn("remote", "floor", 1000.0, transcript="I heard: what")]  # not the answer
    out = Report("tool_overhead")
    report(turns, out)
    by_id = {r["figure"]: r for r in out.records}
    in_process = by_id["tools.overhead_in_process_p50"]
    assert (in_process["value"], in_process["floor"], in_process["beyond_floor"], in_process["n"]) == \
        (1150.0, 1050.0, 100.0, 2)
    assert in_process["note"] == "from the model's first round on: +100 ms"
    assert by_id["tools.call_hop_in_process_p50"]["value"] == 45.0  # (50 + 40) / 2
    remote = by_id["tools.overhead_remote_p50"]
    assert remote["value"] == 1200.0 and remote["floor"] is None and remote["beyond_floor"] is None


def test_each_round_asks_every_turn_and_over_four_rounds_each_takes_every_place():
    every = sorted((path, kind) for path in ("in-process", "remote") for kind in ("tool", "floor"))
    assert all(sorted(order(i)) == every for i in range(8))
    for place in range(4):
        assert sorted(order(i)[place] for i in range(4)) == every
