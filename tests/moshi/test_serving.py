"""Moshi (tiny, CPU) behind the real runner and the realtime websocket, on the engine's real clock."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.metrics import FRAME_OVERRUNS
from duplex_agent.agent.session.ledger import text_heard_by
from duplex_agent.agent.session.ports import AdmissionError
from duplex_agent.plugins.moshi.configs import FRAME_SAMPLES, SAMPLE_RATE
from duplex_agent.plugins.moshi.plugin import MoshiOptions
from tests.moshi.conftest import voice_frames
from tests.runtime.drivers import RunnerDriver, WebSocketDriver

SESSION = {"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": SAMPLE_RATE}}


def tiny_settings(**overrides) -> Settings:
    return Settings(plugin="moshi", plugin_options=MoshiOptions(moshi_config="tiny", device="cpu"), **overrides)


@pytest.fixture
async def moshi_server():
    backend = build_backend(tiny_settings(max_sessions=2))
    server = TestServer(build_app(backend, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    yield server, backend
    await server.close()
    await backend.close()


async def _speak_in_real_time(driver: WebSocketDriver, frames: list[np.ndarray]) -> None:
    """A caller's microphone: 20 ms of pcm16 every 20 ms of the loop's clock."""
    loop = asyncio.get_running_loop()
    audio = np.concatenate(frames)
    step = SAMPLE_RATE // 50
    start = loop.time()
    for index, at in enumerate(range(0, audio.size, step)):
        chunk = (np.clip(audio[at:at + step], -1, 1) * 32767).astype("<i2").tobytes()
        await driver.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
        await asyncio.sleep(max(0.0, start + (index + 1) * 0.02 - loop.time()))  # pacing, not waiting


async def test_audio_in_gives_continuous_24k_audio_out_with_transcript_and_ledger(moshi_server):
    server, backend = moshi_server
    driver = await WebSocketDriver.open(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    try:
        mic = None
        await driver.send(SESSION)
        created, _ = await driver.until("session.created")
        caps = created["session"]["capabilities"]
        assert (caps["input_sample_rate"], caps["output_sample_rate"], caps["unit_samples"]) == (24000, 24000, 1920)
        assert caps["handles_overlap"] is True and caps["input_mode"] == "continuous"

        mic = asyncio.create_task(_speak_in_real_time(driver, voice_frames(1, 60)))
        seen: list[dict] = []
        deltas: list[dict] = []
        while len(deltas) < 25:
            event = await driver.recv(timeout=10)
            seen.append(event)
            if event["type"] == "response.output_audio.delta":
                deltas.append(event)
        kinds = [e["type"] for e in seen]
        assert kinds.index("response.created") < kinds.index("response.speak") < kinds.index(
            "response.output_audio.delta")
        response_id = deltas[0]["response_id"]
        # One response, frame after frame of 80 ms at 24 kHz, each starting where the last ended.
        assert all(d["response_id"] == response_id and d["sample_rate"] == 24000 for d in deltas)
        assert all(len(base64.b64decode(d["delta"])) == 2 * FRAME_SAMPLES for d in deltas)
        starts = [d["audio_start_ms"] for d in deltas]
        assert starts == [80.0 * i for i in range(len(deltas))]
        # Word pieces as transcript deltas; whole words as marks on the audio that spoke them (a
        # word's mark goes out with the frame that ends it, so the marks trail the transcript).
        marks = [m for d in deltas for m in d["marks"]]
        transcript = "".join(e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta")
        assert marks and transcript.startswith("".join(m["text"] for m in marks))
        assert all(m["end_ms"] - m["start_ms"] >= 80.0 and m["start_ms"] >= 0.0 for m in marks)

        # The ledger: the caller heard 400 ms, then cut the agent off.
        await driver.send({"type": "playback.ack", "response_id": response_id, "played_ms": 400.0})
        await driver.send({"type": "response.cancel", "reason": "barge_in"})
        done, _ = await driver.until("response.done", timeout=10)
        assert done["status"] == "cancelled"
        runner = backend.runners[0]
        item = next(i for i in runner.history if i.role == "assistant")
        assert item.ledger.played_ms == 400.0
        assert item.heard_text == text_heard_by(item.ledger.marks, 400.0) != ""
        assert len(item.heard_text) < len(item.ledger.full_text())

        # The conversation goes on in the same slot: Moshi speaks again in a new response.
        slot = backend.engine.slot_of(runner.session_id)
        again, _ = await driver.until("response.speak", timeout=10)
        assert again["response_id"] != response_id
        assert backend.engine.slot_of(runner.session_id) == slot
    finally:
        if mic is not None:
            mic.cancel()
            await asyncio.gather(mic, return_exceptions=True)
        await driver.close()


async def test_one_session_past_max_sessions_is_refused_with_resource_exhausted():
    backend = build_backend(tiny_settings(max_sessions=1))
    try:
        first = await backend.open()
        with pytest.raises(AdmissionError) as refused:
            await backend.open()
        assert refused.value.code == "resource_exhausted"
        await first.close()
        await (await backend.open()).close()  # its slot is free again
    finally:
        await backend.close()


class SlowedModel:
    """The real tiny Moshi, made to take longer than its 80 ms frame (a GPU that cannot keep up)."""

    def __init__(self, model, extra_s: float) -> None:
        self._model, self._extra_s = model, extra_s
        self.capacity, self.frame_samples, self.sample_rate = model.capacity, model.frame_samples, model.sample_rate

    def reset_slots(self, slots):
        self._model.reset_slots(slots)

    def step(self, frames, active):
        import time

        time.sleep(self._extra_s)
        return self._model.step(frames, active)


async def test_a_step_that_overruns_its_frame_says_session_lagging_and_counts():
    backend = build_backend(tiny_settings(max_sessions=1))
    backend.engine.model = SlowedModel(backend.engine.model, 0.12)
    before = FRAME_OVERRUNS._value.get()
    driver = RunnerDriver(await backend.open())
    try:
        await driver.send(SESSION)
        pcm = (voice_frames(2, 1)[0] * 32767).astype("<i2").tobytes()
        await driver.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        lagging, _ = await driver.until("session.lagging", timeout=10)
        assert lagging["lag_ms"] > 0
        assert FRAME_OVERRUNS._value.get() > before  # the Prometheus counter bootstrap wires up
        assert backend.engine.stats.overruns > 0
    finally:
        await driver.close()
        await backend.close()
