"""Overlap with a model that handles it itself: the edge pauses and clears the agent only under
overlap_policy barge_in; under listen it never touches the model's audio (no pause either)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from devtools.speech import speak
from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol.events import (
    OutputAudioBufferCleared,
    ResponseDone,
    SpeechStarted,
)
from duplex_agent.plugins.moshi.plugin import MoshiOptions
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from tests.support.waits import until

pytestmark = pytest.mark.slow


async def _call(policy: str):
    backend = build_backend(Settings(plugin="moshi", max_sessions=1,
                                     plugin_options=MoshiOptions(moshi_config="tiny", device="cpu")))
    conversation = await backend.open()
    events: list = []
    path = CallAudioPath(conversation, overlap_policy=policy, vad_model=SileroVadModel.shared(),
                         on_event=events.append)
    await path.start()
    return backend, conversation, path, events


class Mic:
    """What the caller says next; silence when it has nothing to say."""

    def __init__(self) -> None:
        self.pending = np.zeros(0, np.float32)
        self.spoke = False

    def say(self, audio: np.ndarray) -> None:
        self.pending = np.concatenate([self.pending, audio])
        self.spoke = True

    def frame(self) -> np.ndarray:
        frame, self.pending = self.pending[:960], self.pending[960:]
        return np.pad(frame, (0, 960 - frame.size))


async def _pace(path: CallAudioPath, mic: Mic, heard: list[np.ndarray]) -> None:
    """The transport's 20 ms pacing: one caller frame in, one agent frame out, on the loop's clock,
    until the caller has said what it had to say."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not (mic.spoke and mic.pending.size == 0):
        path.push_caller_frame(mic.frame(), 48000)
        heard.append(path.next_frame())
        await asyncio.sleep(max(0.0, start + (len(heard)) * 0.02 - loop.time()))  # pacing, not waiting


@pytest.mark.parametrize("policy", ["barge_in", "listen"])
async def test_caller_speech_over_moshi_clears_playout_only_under_barge_in(policy):
    backend, conversation, path, events = await _call(policy)
    heard: list[np.ndarray] = []
    speech = speak("Hold on, wait a moment please.", 48000, after_ms=600)
    # A silent caller until the agent is heard (the tiny Moshi talks regardless), then the caller speaks.
    mic = Mic()
    pacing = asyncio.create_task(_pace(path, mic, heard))
    try:
        await until(lambda: path.playout.playing or pacing.done(), 60, "the agent to talk")
        mic.say(speech)
        at_onset: dict[str, object] = {}

        def speech_heard() -> bool:
            if not any(isinstance(e, SpeechStarted) for e in events):
                return pacing.done()
            if conversation.active is not None:  # the agent's response when the caller began to speak
                at_onset.setdefault("ledger", conversation.active.ledger)
                at_onset.setdefault("generated_ms", conversation.active.ledger.generated_ms)
            return True

        await until(speech_heard, 30, "the caller's speech to be heard by the worker")
        await pacing
        cancelled = [e for e in events if isinstance(e, ResponseDone) and e.status == "cancelled"]
        if policy == "barge_in":
            # At least one: the edge's onset detector may hear the phrase's comma as two onsets, and the
            # tiny Moshi talks again in between, so a second barge-in is right too.
            assert path.barge_ins >= 1 and cancelled
            assert path.pauses >= 1  # the first window paused it; the held speech then cancelled it
            assert any(isinstance(e, OutputAudioBufferCleared) for e in events)
        else:
            assert path.barge_ins == 0 and path.pauses == 0 and not cancelled
            assert not any(isinstance(e, OutputAudioBufferCleared) for e in events)
            # The agent kept talking over the caller: the response it was in went on producing audio.
            ledger = at_onset["ledger"]
            assert ledger.generated_ms > at_onset["generated_ms"]  # type: ignore[attr-defined,operator]
    finally:
        pacing.cancel()
        await asyncio.gather(pacing, return_exceptions=True)
        await path.close()
        await backend.close()
