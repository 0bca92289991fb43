"""The epoch rule lives in SessionCore.advance_epoch: every cancel and failure moves it exactly once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from duplex_agent.agent.session.core import SessionCore
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.responses import ResponseManager
from duplex_agent.plugins.contract import DuplexCapabilities


class RecordingBuffer:
    def __init__(self) -> None:
        self.force_listen_cleared = 0

    def clear_force_listen(self) -> None:
        self.force_listen_cleared += 1


class RecordingEngine:
    def __init__(self) -> None:
        self.aborted: list[set[str]] = []

    async def abort(self, request_ids) -> None:  # noqa: ANN001
        self.aborted.append(set(request_ids))


def make_core(input_mode: str) -> tuple[SessionCore, RecordingEngine, list]:
    buffer = RecordingBuffer()
    closed: list[str] = []
    plugin = SimpleNamespace(create_session_state=lambda: SimpleNamespace(audio_buffer=buffer),
                             data_plane=SimpleNamespace(close_stream=closed.append))
    caps = DuplexCapabilities(plugin_id="t", input_sample_rate=16000, unit_samples=1280, output_sample_rate=24000,
                              max_sessions=1, input_mode=input_mode)  # type: ignore[arg-type]
    engine = RecordingEngine()
    events: list = []
    core = SessionCore("s1", plugin, engine, caps, SessionLimits(), events.append, lambda c: c.close(),  # type: ignore[arg-type]
                       lambda item: None)
    return core, engine, events


def test_advance_epoch_in_the_continuous_lane_takes_the_input_request_with_it():
    core, _, _ = make_core("continuous")
    core.input_request_id = "s1-e0-in-1"
    before = core.fence
    stale = core.advance_epoch({"s1-e0-out-2"}, with_input=True)
    assert core.epoch == 1 and not before.admits(core.fence)
    assert stale == {"s1-e0-out-2", "s1-e0-in-1"}
    assert core.input_request_id is None
    assert core.state.audio_buffer.force_listen_cleared == 1


def test_advance_epoch_keeps_an_input_request_that_is_not_the_failed_ones():
    core, _, _ = make_core("continuous")
    core.input_request_id = "s1-e0-in-1"
    stale = core.advance_epoch({"s1-e0-out-2"}, with_input=False)
    assert core.epoch == 1 and stale == {"s1-e0-out-2"}
    assert core.input_request_id == "s1-e0-in-1" and core.state.audio_buffer.force_listen_cleared == 0


def test_a_turn_lane_input_request_outlives_the_epoch():
    core, _, _ = make_core("turn")
    core.input_request_id = "s1-t1-in-1"
    assert core.advance_epoch({"a"}, with_input=True) == {"a"}
    assert core.epoch == 1 and core.input_request_id == "s1-t1-in-1"


def test_drop_input_request_returns_what_it_dropped_once():
    core, _, _ = make_core("turn")
    core.input_request_id = "s1-t1-in-1"
    assert core.drop_input_request() == "s1-t1-in-1"
    assert core.drop_input_request() is None and core.epoch == 0  # the input's own end moves no epoch


@pytest.mark.parametrize("path", ["cancel", "fail"])
async def test_cancel_and_fail_each_move_the_epoch_exactly_once_and_abort_the_stale_requests(path):
    core, engine, events = make_core("continuous")
    responses = ResponseManager(core)
    response = responses.open(turn_id=1)
    core.input_request_id = "s1-e0-in-1"
    response.request_ids.update({"s1-e0-in-1", "s1-e0-talk-2"})
    started_under = response.fence
    if path == "cancel":
        assert await responses.cancel("barge_in")
    else:
        await responses.fail(response, "stage_failed", "boom")
    assert core.epoch == 1
    assert not started_under.admits(core.fence)  # its outputs still on their way are dropped
    assert engine.aborted == [{"s1-e0-in-1", "s1-e0-talk-2"}]
    assert core.input_request_id is None and core.state.audio_buffer.force_listen_cleared == 1
    assert responses.active is None
    done = [e for e in events if type(e).__name__ == "ResponseDone"]
    assert [d.status for d in done] == ["cancelled" if path == "cancel" else "failed"]
    assert not await responses.cancel("again") and core.epoch == 1  # nothing left to cancel: no second move

