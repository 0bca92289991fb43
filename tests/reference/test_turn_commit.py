"""The session commits finished sentences sooner with the end-of-turn model (real runner,
real Piper speech fed as a caller's 20 ms appends, scripted model).

Appends go at a caller's pace; after the speech, each waits for the end-of-turn model's
answers to be in (a real signal), so a busy machine slows the test, not the verdict."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from devtools.speech import speak
from duplex_agent.agent.models.end_of_turn import EndOfTurnModel
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

SR = 16000
FRAME = 320
SENTENCES = [
    "What is the weather like in Paris today?",
    "Can you tell me a joke?",
    "Please turn off the lights in the kitchen.",
    "That sounds like a great idea.",
    "How long does it take to get to the airport?",
    "Could you send me the report by Friday?",
]


@pytest.fixture
async def backend():
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="ok"))
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=2)
    yield backend
    await backend.close()


async def commit_delays_ms(backend: LocalBackend, end_of_turn: bool) -> list[float]:
    """For each sentence: ms of audio sent after the end of speech when the commit arrived."""
    runner = await backend.open()
    runner.send(p.SessionUpdate({"input_audio_format": "pcm_f32le", "input_sample_rate": SR,
                                 "turn_detection": {"type": "server_vad", "end_of_turn": end_of_turn}}))
    loop = asyncio.get_running_loop()
    model = EndOfTurnModel.shared()
    delays = []
    sent_frames = 0  # on the session's input timeline
    for sentence in SENTENCES:
        speech = speak(sentence)
        audio = np.concatenate([np.zeros(SR // 2, np.float32), speech, np.zeros(SR, np.float32)])
        speech_ends = SR // 2 + speech.size
        stopped: list[float] = []

        async def read() -> None:
            async for event in runner.events():
                if isinstance(event, p.SpeechStopped):
                    stopped.append(event.audio_end_ms)  # noqa: B023 (called within this iteration)
                if isinstance(event, p.InputAudioBufferCommitted):
                    delays.append(1000.0 * sent_frames * FRAME / SR - stopped[-1])  # noqa: B023 (called within this iteration)
                    return

        reader = asyncio.create_task(read())
        start = loop.time()
        for k, i in enumerate(range(0, audio.size, FRAME)):
            if reader.done():
                break
            # A caller's pace: one 20 ms append per 20 ms.
            await asyncio.sleep(max(0.0, start + k * FRAME / SR - loop.time()))
            runner.send(p.InputAudioBufferAppend(audio[i : i + FRAME]))
            sent_frames += 1
            answer_due = loop.time() + 30.0
            while i >= speech_ends and model.answered < model.asked and not reader.done():
                assert loop.time() < answer_due, "the end-of-turn model never answered its question"
                await asyncio.sleep(0.005)  # the answer to a question about this pause is on its way
        await asyncio.wait_for(reader, 10)
    await runner.close()
    return delays


async def test_finished_sentences_commit_sooner_with_the_end_of_turn_model(backend):
    """Piper's finished sentences: the commit comes sooner with the model on (on average;
    some sentences keep the full window). The two sessions talk side by side on the backend: the
    delays are on each session's own input timeline, and each waits for the model's answers
    (the model counts every session's questions), so neither's verdict depends on the other."""
    with_model, without = await asyncio.gather(commit_delays_ms(backend, True), commit_delays_ms(backend, False))
    assert len(with_model) == len(without) == len(SENTENCES)
    assert min(without) >= 500  # the fixed window
    assert np.mean(with_model) < np.mean(without) - 50, (with_model, without)
    assert sum(a < b - 150 for a, b in zip(with_model, without)) >= 2, (with_model, without)
