"""Moshi's switches between talking and silence become response.speak / response.listen and response boundaries.

The tiny random model talks nearly all the time, so these frames come from a scripted frame
model (a unit test of the mapping: the real plugin, engine and runner, a fake model).
"""

from __future__ import annotations

import base64

import numpy as np

from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.engines.frame_batch import FrameBatchEngine
from duplex_agent.plugins.moshi.configs import FRAME_SAMPLES, SAMPLE_RATE
from duplex_agent.plugins.moshi.model import SlotOutput
from duplex_agent.plugins.moshi.plugin import MoshiPlugin
from duplex_agent.plugins.moshi.turns import FloorTracker
from tests.runtime.drivers import RunnerDriver

#: Text per frame: words, a pause shorter than the yield, words, then a silence long enough to yield.
SCRIPT = [" hi", " there", "", "", " friend"] + [""] * 10 + [" again"] + [""] * 20


class ScriptedFrames:
    capacity, frame_samples, sample_rate = 1, FRAME_SAMPLES, SAMPLE_RATE

    def __init__(self) -> None:
        self.index = 0
        self.floor = FloorTracker(quiet_frames_to_yield=10)

    def reset_slots(self, slots) -> None:
        self.index = 0

    def step(self, frames, active):
        text = SCRIPT[min(self.index, len(SCRIPT) - 1)]
        self.index += 1
        speaking, yielded = self.floor.push(bool(text))
        audio = np.full(FRAME_SAMPLES, 0.1 if speaking else 0.0, np.float32)
        return [SlotOutput(audio, 5 if text else 3, (1, 2), text, speaking, yielded)]


def test_the_floor_tracker_takes_the_floor_on_a_word_and_yields_after_quiet_frames():
    floor = FloorTracker(quiet_frames_to_yield=3)
    assert [floor.push(w) for w in (False, True, False, False, True, False, False, False, False)] == [
        (False, False), (True, False), (True, False), (True, False), (True, False), (True, False),
        (True, False), (False, True), (False, False)]


async def test_words_open_a_response_and_a_long_silence_closes_it():
    plugin = MoshiPlugin(as_float32_audio, max_sessions=1)
    plugin.engine = FrameBatchEngine(ScriptedFrames())
    backend = LocalBackend(plugin, plugin.engine, max_sessions=1)
    driver = RunnerDriver(await backend.open())
    try:
        await driver.send({"type": "session.update", "session": {"turn_detection": None,
                                                                 "input_sample_rate": SAMPLE_RATE}})
        pcm = np.zeros(FRAME_SAMPLES * len(SCRIPT), "<i2").tobytes()
        await driver.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        first, seen = await driver.until("response.done", timeout=20)
        kinds = [e["type"] for e in seen]
        assert kinds.index("response.created") < kinds.index("response.speak") < kinds.index("response.listen")
        assert first["status"] == "completed" and first["reason"] == "model_yielded"
        transcript = [e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta"]
        assert transcript == [" hi", " there", " friend"]
        # The pause inside the turn is part of it: 14 frames of audio; the yielding frame is not sent.
        audio = [e for e in seen if e["type"] == "response.output_audio.delta"]
        assert len(audio) == 14 and audio[-1]["audio_start_ms"] == 13 * 80.0
        second, seen = await driver.until("response.speak", timeout=20)
        assert second["response_id"] != first["response_id"]
    finally:
        await driver.close()
        await backend.close()


def test_word_pieces_become_whole_word_marks_over_the_frames_that_spoke_them():
    from duplex_agent.agent.protocol.audio import as_float32_audio
    from duplex_agent.plugins.contract.engine import StageOutput
    from duplex_agent.plugins.moshi.data_plane import MoshiDataPlane

    plane = MoshiDataPlane(as_float32_audio, sample_rate=SAMPLE_RATE)
    pieces = [" hel", "lo", " wor", "ld", "", ""]
    audio = np.zeros(FRAME_SAMPLES, np.float32)
    projected = [list(plane.project(StageOutput("s-e0-in-1", 0, SlotOutput(audio, 5, (1, 2), p, True, False))))
                 for p in pieces]
    marks = [(m["text"], m["start_ms"] + 80.0 * i, m["end_ms"] + 80.0 * i)
             for i, events in enumerate(projected) for m in events[0]["marks"]]
    assert marks == [(" hello", 0.0, 160.0), (" world", 160.0, 320.0)]
    transcript = "".join(e["delta"] for events in projected for e in events[1:])
    assert transcript == " hello world"
