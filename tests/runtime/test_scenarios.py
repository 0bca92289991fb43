"""The runner's event sequences, driven directly and over the realtime websocket."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex_agent.agent.protocol.omni_wire import omni_error_code
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.plugins.engines.inprocess import InProcessEngine
from duplex_agent.plugins.scripted import ListenerStage, Script, SpeakerStage
from tests.runtime.conftest import TRANSPORTS
from tests.support.audio import tone

MANUAL = {"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": 16000}}


async def _exchange(driver, *, ms: float = 300.0) -> list[dict]:
    await driver.send(MANUAL)
    await driver.until("session.created")
    await driver.append(tone(ms))
    await driver.send({"type": "input_audio_buffer.commit"})
    _, seen = await driver.until("response.done")
    return seen


@TRANSPORTS
async def test_append_speak_audio_done(open_driver, transport):
    driver, plugin, _ = await open_driver(Script(reply="hello there friend"), transport=transport)
    seen = await _exchange(driver)
    kinds = [e["type"] for e in seen]
    order = ["input_audio_buffer.committed", "response.created",
             "conversation.item.input_audio_transcription.completed", "response.speak",
             "response.output_audio.delta", "response.output_audio.done", "response.done"]
    positions = [kinds.index(k) for k in order]
    assert positions == sorted(positions), kinds
    transcript = next(e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert transcript["transcript"] == "heard 15 units"  # 300 ms in 20 ms units
    deltas = [e for e in seen if e["type"] == "response.output_audio.delta"]
    assert [d["marks"][0]["text"] for d in deltas] == ["hello", "there", "friend"]
    assert [d["audio_start_ms"] for d in deltas] == [0.0, 100.0, 200.0]
    done = seen[-1]
    assert done["status"] == "completed" and done["audio_ms"] == 300.0
    if transport == "websocket":
        seqs = [e["server_event_seq"] for e in seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


class SlowAbortEngine(InProcessEngine):
    """Like a remote engine: an abort takes effect late, so old outputs keep arriving: it lands
    only once the aborted request has yielded one more output.

    ``old_streams_ended`` is set once every stream of an aborted request has ended.
    """

    def __init__(self, stages) -> None:
        super().__init__(stages)
        self.aborting: set[str] = set()
        self.old_streams_ended = asyncio.Event()

    async def abort(self, request_ids):
        self.aborting.update(i for i in request_ids if i in self._requests)

    async def outputs(self, request_id):
        try:
            async for output in super().outputs(request_id):
                yield output
                if request_id in self.aborting:
                    await InProcessEngine.abort(self, [request_id])
        finally:
            if request_id in self.aborting:
                self.aborting.discard(request_id)
                if not self.aborting:
                    self.old_streams_ended.set()


@TRANSPORTS
async def test_barge_in_mid_response(open_driver, transport):
    script = Script(word_delay_s=0.03, hold_after_words=3)
    engine = SlowAbortEngine([ListenerStage(script), SpeakerStage(script)])
    driver, plugin, _ = await open_driver(script, transport=transport, engine=engine)
    await driver.send(MANUAL)
    await driver.until("session.created")
    await driver.append(tone(200))
    await driver.send({"type": "input_audio_buffer.commit"})
    created, _ = await driver.until("response.created")
    response_id = created["response_id"]
    for _ in range(3):
        await driver.until("response.output_audio.delta")
    # The edge's sequence: stop playout, cancel, acknowledge what was played.
    await driver.send({"type": "response.cancel", "reason": "barge_in"})
    await driver.send({"type": "playback.ack", "response_id": response_id, "played_ms": 150})
    done, seen = await driver.until("response.done")
    assert done["status"] == "cancelled" and done["reason"] == "barge_in"
    # vLLM-Omni's order: the output is cleared, the reply's part and item are done, then the response.
    tail = [event["type"] for event in seen[-5:]]
    assert tail == ["output_audio_buffer.cleared", "response.content_part.done", "response.output_item.done",
                    "conversation.item.done", "response.done"], tail
    assert seen[-5]["response_id"] == response_id
    acknowledged, _ = await driver.until("playback.acknowledged")
    assert acknowledged["played_ms"] == 150

    # The model says on after the cancel: old-epoch outputs arrive until the late abort lands;
    # none may reach the client.
    script.released.set()
    # Once their streams ended, a marker sent now comes back next: nothing stale came before it.
    await asyncio.wait_for(engine.old_streams_ended.wait(), 5)
    await driver.send({"type": "input_dtmf", "digit": "5"})
    marker = await driver.recv()
    assert marker["type"] == "input_dtmf.received", f"late event after cancel: {marker}"

    # Next turn: the model's context holds only what was heard ("one", not "one two ...").
    await driver.append(tone(200))
    await driver.send({"type": "input_audio_buffer.commit"})
    await driver.until("response.created")
    assert plugin.script.context == ["one"]
    if driver.runner is not None:
        assert driver.runner.dropped_stale_outputs > 0
        assistant = [i for i in driver.runner.history if i.role == "assistant"][0]
        assert assistant.heard_text == "one"


@TRANSPORTS
async def test_silence_continuation_does_not_drift(open_driver, transport):
    script = Script(input_mode="continuous", unit_samples=320, silence_continuation_samples=320)
    driver, plugin, backend = await open_driver(script, transport=transport)
    await driver.send({"type": "session.update", "session": {"turn_detection": None}})
    await driver.until("session.created")
    await driver.append(tone(20))
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while len(script.unit_log) < 101 and loop.time() < end:
        await asyncio.sleep(0.05)
    assert len(script.unit_log) >= 101
    period = 0.02
    silence = [(arrived, deadline) for arrived, _, deadline in script.unit_log if deadline is not None][:100]
    assert len(silence) == 100
    first = silence[0][1]
    # Deadlines sit exactly on the grid anchor + k * period: the schedule cannot drift.
    slots = [(deadline - first) / period for _, deadline in silence]
    assert all(abs(k - round(k)) < 1e-6 for k in slots)
    slots = [round(k) for k in slots]
    assert all(b > a for a, b in zip(slots, slots[1:], strict=False))
    # A slot is empty only where the loop was too late and the unit was skipped, not sent late.
    assert slots[-1] + 1 - len(slots) <= backend.runners[0].skipped_silence_units
    # No unit goes out before its deadline. How far behind it units arrive depends on the
    # machine: bench.runtime_overhead prints that lag.
    assert all(arrived >= deadline for arrived, deadline in silence)


@TRANSPORTS
async def test_failed_append_rolls_back_and_session_continues(open_driver, transport):
    script = Script(fail_submit_at=3)
    driver, _, _ = await open_driver(script, transport=transport)
    await driver.send(MANUAL)
    await driver.until("session.created")
    await driver.append(tone(100))  # five 20 ms units; the third submit fails
    error, _ = await driver.until("error")
    assert error["error"]["code"] == ("append_failed" if transport == "runner" else omni_error_code("append_failed"))
    if driver.runner is not None:
        # The failed unit's bytes are back in front of the buffer.
        assert driver.runner.state.audio_buffer.pending_byte_count >= 320 * 4
    await driver.append(tone(100))
    await driver.send({"type": "input_audio_buffer.commit"})
    done, _ = await driver.until("response.done")
    assert done["status"] == "completed"


@TRANSPORTS
async def test_stage_failure_fails_the_response(open_driver, transport):
    driver, _, _ = await open_driver(Script(fail_after_words=2), transport=transport)
    seen = await _exchange(driver)
    codes = [e["error"]["code"] for e in seen if e["type"] == "error"]
    assert codes == ["stage_failed" if transport == "runner" else omni_error_code("stage_failed")]
    assert seen[-1]["status"] == "failed"
    seen = await _exchange_again(driver)
    assert seen[-1]["type"] == "response.done"


async def _exchange_again(driver) -> list[dict]:
    await driver.append(tone(100))
    await driver.send({"type": "input_audio_buffer.commit"})
    _, seen = await driver.until("response.done")
    return seen


@TRANSPORTS
async def test_admission_refuses_past_max_sessions(open_driver, transport):
    driver, _, backend = await open_driver(Script(), transport=transport, max_sessions=1)
    await driver.send(MANUAL)
    await driver.until("session.created")
    if transport == "runner":
        from duplex_agent.agent.session.ports import AdmissionError

        with pytest.raises(AdmissionError) as refused:
            await backend.open()
        assert refused.value.code == "resource_exhausted"
    else:
        from tests.runtime.drivers import WebSocketDriver

        second = await WebSocketDriver.open(str(driver.server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
        try:
            await second.send(MANUAL)
            error = await second.recv()
            assert error["type"] == "error" and error["error"]["code"] == "resource_exhausted"
        finally:
            await second.close()
    # The first session is unaffected.
    seen = await _exchange_again(driver)
    assert seen[-1]["status"] == "completed"


async def test_a_saturated_machine_refuses_a_new_websocket_session_and_serves_the_open_one(open_driver):
    from duplex_agent.agent.session.cpu_guard import CpuGuard
    from tests.runtime.drivers import WebSocketDriver
    from tests.support.cpu import ScriptedCpu

    cpu = ScriptedCpu()
    guard = CpuGuard(0.9, cpu.meter())
    driver, _, _ = await open_driver(Script(), transport="websocket", cpu_guard=guard)
    cpu.run(guard.meter, 6.0, 0.3)
    await driver.send(MANUAL)
    await driver.until("session.created")
    cpu.run(guard.meter, 6.0, 1.0)
    second = await WebSocketDriver.open(str(driver.server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    try:
        await second.send(MANUAL)
        error = await second.recv()
        assert error["type"] == "error" and error["error"]["code"] == "overloaded", error
        assert "busy" in error["error"]["message"]
    finally:
        await second.close()
    seen = await _exchange_again(driver)  # the open session is served on
    assert seen[-1]["status"] == "completed"


@TRANSPORTS
async def test_pending_turns_backpressure(open_driver, transport):
    script = Script(word_delay_s=0.05, hold_after_words=0)  # the first turn's reply waits: no race with it
    driver, _, _ = await open_driver(script, transport=transport, limits=SessionLimits(max_pending_turns=1))
    await driver.send({"type": "session.update", "session": {"turn_detection": None, "overlap_policy": "listen"}})
    await driver.until("session.created")
    for _ in range(3):  # one turn answering, one waiting, the third is refused
        await driver.append(tone(60))
        await driver.send({"type": "input_audio_buffer.commit"})
    error, seen = await driver.until("error")
    assert error["error"]["code"] == "input_backpressure"
    committed = [e for e in seen if e["type"] == "input_audio_buffer.committed"]
    assert len(committed) == 2
    # Both accepted turns are answered, in order.
    script.released.set()
    first, _ = await driver.until("response.done", timeout=5)
    second, _ = await driver.until("response.done", timeout=5)
    assert first["status"] == second["status"] == "completed"


@TRANSPORTS
async def test_pending_input_bytes_backpressure(open_driver, transport):
    limits = SessionLimits(max_buffered_input_ms=200)
    driver, _, _ = await open_driver(Script(unit_samples=16000), transport=transport, limits=limits)
    await driver.send(MANUAL)
    await driver.until("session.created")
    await driver.append(tone(400), chunk_ms=100)  # units are 1 s: input piles up in the buffer
    error, _ = await driver.until("error")
    assert error["error"]["code"] == "input_backpressure"
    await driver.send({"type": "input_audio_buffer.clear"})
    await driver.until("input_audio_buffer.cleared")
    await driver.append(tone(100))
    await driver.send({"type": "input_audio_buffer.commit"})
    done, _ = await driver.until("response.done")
    assert done["status"] == "completed"


async def test_a_model_behind_real_time_says_so(open_driver):
    driver, _, _ = await open_driver(Script(reply="slow words", lag_ms=120.0))
    seen = await _exchange(driver)
    lagging = [e for e in seen if e["type"] == "session.lagging"]
    assert [e["lag_ms"] for e in lagging] == [120.0, 120.0]
    assert lagging[0]["stage"] == "stage1"


async def test_idle_session_expires(open_driver):
    driver, _, backend = await open_driver(Script(), limits=SessionLimits(idle_timeout_s=0.3))
    await driver.send(MANUAL)
    closed, _ = await driver.until("session.closed", timeout=5)
    assert closed["reason"] == "idle_timeout"
    assert backend.active_sessions == 0


def test_tone_helper_is_loud():
    assert float(np.abs(tone(20)).max()) > 0.05


def test_the_scripts_logs_keep_only_their_newest_entries(monkeypatch):
    """A worker serving the scripted model for hours keeps a bounded log of what it saw."""
    from duplex_agent.plugins import scripted

    monkeypatch.setattr(scripted, "LOG_KEPT", 3)
    log: list[int] = []
    for entry in range(20):
        scripted._logged(log, entry)
    assert 3 <= len(log) <= 6 and log == list(range(20))[-len(log):]
