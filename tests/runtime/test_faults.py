"""Faults stay inside the response (or session) they hit: plugin and engine exceptions,
a failed silence submit, a client that stops reading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.protocol.omni_wire import omni_error_code
from duplex_agent.agent.session.limits import SessionLimits
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.contract.engine import StageOutput, request_session_id
from duplex_agent.plugins.engines.inprocess import InProcessEngine
from duplex_agent.plugins.scripted import ListenerStage, Script, ScriptedPlugin, SpeakerStage
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane
from tests.runtime.conftest import TRANSPORTS
from tests.runtime.drivers import Driver, RunnerDriver
from tests.support.audio import tone

MANUAL = {"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": 16000}}


class FaultyPlugin(ScriptedPlugin):
    """Raises from one hook, once, on an output of the session whose reply says ``15``
    (its caller spoke 300 ms: 15 units), and only there."""

    def __init__(self, hook: str, script: Script) -> None:
        super().__init__(as_float32_audio, script)
        self.hook = hook
        self.raised = 0
        plugin = self

        class FaultyDataPlane(SpeechDataPlane):
            def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
                assert isinstance(result, StageOutput)
                if plugin._trips("project", result.output):
                    raise RuntimeError("scripted data plane failure")
                return super().project(result, context=context)

        self.data_plane = FaultyDataPlane(as_float32_audio, sample_rate=16000)

    def _trips(self, hook: str, output: object, key: str = "text") -> bool:
        text = str(output.get(key, "")) if isinstance(output, dict) else ""
        if hook == self.hook and "15" in text and not self.raised:
            self.raised += 1
            return True
        return False

    def decide_output(self, **kwargs):  # type: ignore[override]
        if self._trips("decide_output", kwargs["output"]):
            raise RuntimeError("scripted decide_output failure")
        return super().decide_output(**kwargs)

    def plan_partial_stage_output(self, orchestrator, stage_id, replica_id, output, req_state):  # type: ignore[override]
        if self._trips("plan_partial_stage_output", output, "transcript"):
            raise RuntimeError("scripted forward failure")
        return super().plan_partial_stage_output(orchestrator, stage_id, replica_id, output, req_state)


class FailingStreamEngine(InProcessEngine):
    """Reading the outputs of one session's speaker request raises after two outputs, once."""

    def __init__(self, stages, failing_session: list[str]) -> None:
        super().__init__(stages)
        self.failing_session = failing_session

    async def outputs(self, request_id: str) -> AsyncIterator[StageOutput]:
        count = 0
        async for output in super().outputs(request_id):
            yield output
            count += 1
            if count == 2 and output.stage_id == 1 and request_session_id(request_id) in self.failing_session:
                self.failing_session.clear()  # once
                raise ConnectionResetError("scripted stream failure")


async def _turn(driver: Driver, ms: float) -> list[dict]:
    await driver.append(tone(ms))
    await driver.send({"type": "input_audio_buffer.commit"})
    _, seen = await driver.until("response.done")
    return seen


async def _two_sessions(backend: LocalBackend) -> tuple[RunnerDriver, RunnerDriver]:
    drivers = (await RunnerDriver.open(backend), await RunnerDriver.open(backend))
    for driver in drivers:
        await driver.send(MANUAL)
        await driver.until("session.created")
    return drivers


@pytest.mark.parametrize("hook, code", [("decide_output", "plugin_error"), ("project", "plugin_error"),
                                        ("plan_partial_stage_output", "plugin_error"), ("engine", "stage_failed")])
async def test_an_exception_mid_response_fails_that_response_only(hook, code):
    script = Script(reply=None, word_delay_s=0.01)  # the reply says "you said heard N units"
    plugin = FaultyPlugin(hook, script)
    failing: list[str] = []
    engine = FailingStreamEngine([ListenerStage(script), SpeakerStage(script)], failing)
    backend = LocalBackend(plugin, engine)
    try:
        hit, other = await _two_sessions(backend)
        if hook == "engine":
            failing.append(hit.runner.session_id)
        # Both sessions talk at once; only the first one's turn meets the fault.
        hit_seen, other_seen = await asyncio.gather(_turn(hit, 300), _turn(other, 200))

        errors = [e for e in hit_seen if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == [code]
        assert errors[0]["error"]["type"] == "server_error"
        done = hit_seen[-1]
        assert done["status"] == "failed" and done["reason"] == code
        assert hit.runner.active is None

        assert not [e for e in other_seen if e["type"] == "error"]
        assert other_seen[-1]["status"] == "completed"
        spoken = [e["marks"][0]["text"] for e in other_seen if e["type"] == "response.output_audio.delta"]
        assert spoken == ["you", "said", "heard", "10", "units"]

        # The session that met the fault serves its next turn in full.
        again = await _turn(hit, 200)
        assert again[-1]["status"] == "completed"
        assert not [e for e in again if e["type"] == "error"]
        assert [e["marks"][0]["text"] for e in again if e["type"] == "response.output_audio.delta"][-2:] == \
            ["10", "units"]
        assert backend.active_sessions == 2
    finally:
        await backend.close()


async def test_over_the_websocket_a_raising_plugin_fails_one_response_of_one_session(open_driver):
    from tests.runtime.drivers import WebSocketDriver

    script = Script(reply=None, word_delay_s=0.01)
    hit, _, _ = await open_driver(transport="websocket", plugin=FaultyPlugin("decide_output", script))
    other = await WebSocketDriver.open(str(hit.server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    try:
        for driver in (hit, other):
            await driver.send(MANUAL)
            await driver.until("session.created")
        hit_seen, other_seen = await asyncio.gather(_turn(hit, 300), _turn(other, 200))
        assert [e["error"]["code"] for e in hit_seen if e["type"] == "error"] == ["plugin_error"]
        assert hit_seen[-1]["status"] == "failed"
        assert other_seen[-1]["status"] == "completed" and not [e for e in other_seen if e["type"] == "error"]
        assert (await _turn(hit, 200))[-1]["status"] == "completed"
    finally:
        await other.close()


async def test_a_plugin_failing_to_plan_input_rolls_back_and_the_session_serves_on(open_driver):
    class PlanFails(ScriptedPlugin):
        fail = True

        def plan_append(self, **kwargs):  # type: ignore[override]
            if self.fail:
                self.fail = False
                raise ValueError("scripted plan failure")
            return super().plan_append(**kwargs)

    plugin = PlanFails(as_float32_audio, Script(reply="fine"))
    backend = LocalBackend(plugin, plugin.build_local_engine())
    try:
        driver = await RunnerDriver.open(backend)
        await driver.send(MANUAL)
        await driver.until("session.created")
        await driver.append(tone(20))
        error, _ = await driver.until("error")
        assert error["error"]["code"] == "plugin_error"
        seen = await _turn(driver, 200)
        assert seen[-1]["status"] == "completed"
    finally:
        await backend.close()


async def test_a_failing_background_task_is_reported_not_dropped():
    class AbortFails(InProcessEngine):
        async def abort(self, request_ids):
            ids = list(request_ids)
            await super().abort(ids)
            if ids:
                raise RuntimeError("scripted abort failure")

    script = Script(reply="ok")
    plugin = ScriptedPlugin(as_float32_audio, script)
    backend = LocalBackend(plugin, AbortFails([ListenerStage(script), SpeakerStage(script)]))
    try:
        driver = await RunnerDriver.open(backend)
        await driver.send(MANUAL)
        await driver.until("session.created")
        await driver.append(tone(100))
        await driver.send({"type": "input_audio_buffer.clear"})  # aborts the open input request in a task
        error, _ = await driver.until("error")
        assert error["error"]["code"] == "internal_error" and "scripted abort failure" in error["error"]["message"]
        seen = await _turn(driver, 200)
        assert seen[-1]["status"] == "completed"
    finally:
        await backend.close()


@TRANSPORTS
async def test_a_silence_submit_that_fails_once_does_not_stop_continuation(open_driver, transport):
    # Submit 1 is the caller's unit; 2, 3, ... are silence units; the 4th submit is refused.
    script = Script(input_mode="continuous", fail_submit_at=4)
    driver, _, _ = await open_driver(script, transport=transport)
    await driver.send({"type": "session.update", "session": {"turn_detection": None}})
    await driver.until("session.created")
    await driver.append(tone(20))
    error, _ = await driver.until("error")
    assert error["error"]["code"] == ("append_failed" if transport == "runner" else omni_error_code("append_failed"))
    silence_before = sum(deadline is not None for _, _, deadline in script.unit_log)
    # Continuation resumes: more silence units reach the model after the failure.
    loop = asyncio.get_running_loop()
    end = loop.time() + 10.0
    while sum(deadline is not None for _, _, deadline in script.unit_log) < silence_before + 10:
        assert loop.time() < end, f"silence continuation stalled after the failed submit: {script.unit_log[-3:]}"
        await asyncio.sleep(0.02)
    assert script.submits >= 14


@pytest.mark.parametrize("rule, limits", [
    ("stalled", SessionLimits(client_stall_s=0.5)),  # behind, and read nothing for 0.5 s
    ("hard cap", SessionLimits(max_unread_audio_ms=20_000, client_stall_s=3600)),
])
async def test_a_client_that_stops_reading_is_cut_off_with_a_reason(rule, limits):
    """30 s of caller audio, answered unit for unit, while the client reads nothing."""
    script = Script(input_mode="continuous", quiet_units_to_listen=10_000)
    plugin = ScriptedPlugin(as_float32_audio, script)
    backend = LocalBackend(plugin, plugin.build_local_engine(), limits=limits)
    try:
        runner = await backend.open()
        runner.send(p.SessionUpdate({"turn_detection": None}))
        frame = tone(20)
        peak_events = 0
        for i in range(1500):  # 30 s in 20 ms frames, sent faster than real time
            runner.send(p.InputAudioBufferAppend(frame))
            if i % 25 == 0:
                await asyncio.sleep(0)  # let the runner work between bursts
                peak_events = max(peak_events, len(runner.outbox))
        await asyncio.wait_for(runner.wait_closed(), 30)

        assert runner.closed_reason == "client_too_slow"
        # Never more audio was held for the client than the rules allow...
        bytes_per_ms = 16000 * 4 / 1000
        held_ms = runner.outbox.peak_audio_bytes / bytes_per_ms
        assert limits.lagging_unread_audio_ms < held_ms <= min(limits.max_unread_audio_ms + 20, 30_000)
        assert peak_events <= limits.max_unread_events
        # ...and nothing is held now but the two events that say why.
        assert runner.outbox.audio_bytes == 0 and len(runner.outbox) == 2
        lagging = await runner.next_event()
        closed = await runner.next_event()
        assert isinstance(lagging, p.SessionLagging) and lagging.stage == "client"
        assert lagging.lag_ms > limits.lagging_unread_audio_ms
        assert isinstance(closed, p.SessionClosed) and closed.reason == "client_too_slow"
        assert await runner.next_event() is None
        assert backend.active_sessions == 0
    finally:
        await backend.close()


async def test_a_client_that_reads_late_is_told_it_lags_before_the_cut():
    script = Script(reply=" ".join(["word"] * 150), word_ms=100.0)  # a 15 s reply, generated at once
    plugin = ScriptedPlugin(as_float32_audio, script)
    backend = LocalBackend(plugin, plugin.build_local_engine(), limits=SessionLimits(client_stall_s=60))
    try:
        driver = await RunnerDriver.open(backend)
        await driver.send(MANUAL)
        await driver.append(tone(200))
        await driver.send({"type": "input_audio_buffer.commit"})
        loop = asyncio.get_running_loop()
        end = loop.time() + 10.0
        while driver.runner.outbox.audio_ms < 15_000:  # the whole reply waits unread
            assert loop.time() < end and driver.runner.closed_reason is None
            await asyncio.sleep(0.01)
        lagging, _ = await driver.until("session.lagging")  # past the lag threshold it was told
        assert lagging["stage"] == "client" and lagging["lag_ms"] > 10_000
        done, _ = await driver.until("response.done")  # a client that catches up gets everything
        assert done["status"] == "completed" and done["audio_ms"] == 15_000
        assert driver.runner.closed_reason is None
    finally:
        await backend.close()


async def test_history_is_capped_at_the_limit():
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="ok"))
    backend = LocalBackend(plugin, plugin.build_local_engine(), limits=SessionLimits(max_history_items=6))
    try:
        driver = await RunnerDriver.open(backend)
        await driver.send(MANUAL)
        await driver.until("session.created")
        for _ in range(8):
            assert (await _turn(driver, 100))[-1]["status"] == "completed"
        assert len(driver.runner.history) <= 6
        assert [i.role for i in driver.runner.history][-2:] == ["user", "assistant"]
        assert len(plugin.script.context) == 7  # every earlier reply reached the model's context first
    finally:
        await backend.close()


async def test_a_websocket_client_that_stops_reading_is_cut_off(open_driver):
    """Over a real socket: the kernel's buffers fill, the server's sender blocks, the runner's
    outbox reaches its limit, and what the client finally reads ends with the reason."""
    script = Script(reply=" ".join(["word"] * 6000), word_ms=100.0)  # 10 minutes of reply
    driver, _, backend = await open_driver(script, transport="websocket")
    await driver.send(MANUAL)
    await driver.until("session.created")
    runner = backend.runners[0]
    await driver.append(tone(200))
    await driver.send({"type": "input_audio_buffer.commit"})  # and then read nothing
    await asyncio.wait_for(runner.wait_closed(), 60)
    assert runner.closed_reason == "client_too_slow"
    limit_bytes = SessionLimits().max_unread_audio_ms / 1000 * 16000 * 4
    assert runner.outbox.peak_audio_bytes <= limit_bytes + 1600 * 4
    closed, seen = await driver.until("session.closed", timeout=60)
    assert closed["reason"] == "client_too_slow"
    assert seen[-2]["type"] == "session.lagging" and seen[-2]["stage"] == "client"
    spoken_ms = sum(e["audio_ms"] for e in seen if e["type"] == "response.output_audio.delta")
    assert spoken_ms < 600_000  # the rest was never buffered for it
