"""One VAD pass per call: the edge onset detector scores each window once and the session's
turn detection reads those scores, finding the same speech as when it runs the model itself
(real call audio path, real runner, real Silero, Piper and espeak speech)."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

from devtools.speech import espeak, speak
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.media.call_audio import CallAudioPath

RATE = 48000
FRAME = 960


class CountingVad:
    """The real Silero model, counting the windows it scores."""

    def __init__(self) -> None:
        self._model = SileroVadModel.shared()
        self.windows = 0

    def open_stream(self):  # noqa: ANN201
        inner, outer = self._model.open_stream(), self

        class Scorer:
            def probability(self, window: np.ndarray) -> float:
                outer.windows += 1
                return inner.probability(window)

            def reset(self) -> None:
                inner.reset()

        return Scorer()


class WithoutSharing(Conversation):
    """The runner behind the port's default use_caller_vad (it does nothing): the session runs the model itself."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self._inner = inner
        self.send, self.events, self.close = inner.send, inner.events, inner.close

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def capabilities(self):  # noqa: ANN201
        return self._inner.capabilities


async def speech_events(audio: np.ndarray, share: bool) -> tuple[list[tuple[str, float]], int, int]:
    """(VAD events of the session, windows scored on the input's grid, windows of input) for one call.
    The edge's offset grid, which scores the caller only while the agent's reply plays (onset.py),
    for its pauses alone, is left out."""
    vad = CountingVad()
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="ok"))
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1, vad_model=vad)
    runner = await backend.open()
    conversation = runner if share else WithoutSharing(runner)
    seen: list[tuple[str, float]] = []
    stopped = asyncio.Event()

    def on_event(event: p.ServerEvent) -> None:
        if isinstance(event, p.SpeechStarted):
            seen.append(("started", event.audio_start_ms))
        elif isinstance(event, p.SpeechStopped):
            seen.append(("stopped", event.audio_end_ms))
            if sum(kind == "stopped" for kind, _ in seen) == 2:
                stopped.set()

    path = CallAudioPath(conversation, vad_model=vad, on_event=on_event,
                         turn_detection={"type": "server_vad", "end_of_turn": False})
    await path.start()
    try:
        for i in range(0, audio.size, FRAME):
            path.push_caller_frame(audio[i : i + FRAME], RATE)
            await asyncio.sleep(0)  # let the runner take each append, as a call's pace would
        await asyncio.wait_for(stopped.wait(), 30)
    finally:
        await path.close()
        await backend.close()
    grid_windows = vad.windows - path._onset.half_step_windows_scored
    return seen, grid_windows, audio.size * 16000 // RATE // 512


VOICES = [
    pytest.param(lambda text: speak(text, RATE), id="piper"),
    pytest.param(lambda text: espeak(text, RATE, voice="en-us"), id="espeak-en-us",
                 marks=pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")),
]


@pytest.mark.parametrize("voice", VOICES)
async def test_turn_detection_reads_the_edge_scores_and_finds_the_same_speech(voice):
    gap = np.zeros(RATE, np.float32)
    audio = np.concatenate([gap[: RATE // 2], voice("Can you book a table for two tonight?"), gap,
                            voice("Thank you very much."), gap, gap])
    shared, shared_windows, windows = await speech_events(audio, share=True)
    alone, alone_windows, _ = await speech_events(audio, share=False)
    assert [kind for kind, _ in shared] == [kind for kind, _ in alone] == ["started", "stopped"] * 2
    # Onsets and ends of speech where the session's own pass puts them (within one 32 ms window).
    assert all(abs(a - b) <= 32 for (_, a), (_, b) in zip(shared, alone)), (shared, alone)
    # One pass: the edge's windows only (a few at the ends may be scored twice), against two.
    assert shared_windows <= windows + 4
    assert alone_windows >= 2 * windows - 8
