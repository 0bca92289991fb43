"""Caller -> worker (remote backend) -> our server -> reference model, and back, in real time.

Our realtime endpoint stands in for a vLLM-Omni server on the CPU. The worker
side is the transports' shared ``CallAudioPath`` over a ``RemoteConversation``:
48 kHz caller frames go in every 20 ms, 20 ms playout frames come out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from devtools.speech import speak, transcribe, words
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")


@pytest.fixture
async def call():
    """(plugin on the server, CallAudioPath over a remote conversation, server events seen by the worker)."""
    plugin = ReferencePlugin(as_float32_audio)
    local = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    remote = RemoteBackend(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    await remote.start()
    conversation = await remote.open()
    seen: list[p.ServerEvent] = []
    path = CallAudioPath(conversation, on_event=seen.append)
    await path.start()
    yield plugin, conversation, path, seen
    await path.close()
    await remote.close()
    await server.close()
    await local.close()


class Caller:
    """Paces a call in real time: one 20 ms caller frame in, one playout frame out."""

    def __init__(self, path: CallAudioPath) -> None:
        self.path = path
        self.heard: list[np.ndarray] = []
        self._speech = np.zeros(0, np.float32)

    def say(self, audio_48k: np.ndarray) -> None:
        self._speech = np.concatenate([self._speech, audio_48k])

    async def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        start = next_at = loop.time()
        while not done():
            assert loop.time() - start < timeout, "timed out"
            frame, self._speech = self._speech[:FRAME_SAMPLES], self._speech[FRAME_SAMPLES:]
            self.path.push_caller_frame(np.pad(frame, (0, FRAME_SAMPLES - frame.size)), SAMPLE_RATE)
            self.heard.append(self.path.next_frame())
            next_at += FRAME_SAMPLES / SAMPLE_RATE
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def audio(self, since: int = 0) -> np.ndarray:
        return np.concatenate(self.heard[since:]).astype(np.float32) / 32768.0


async def test_a_spoken_question_gets_a_spoken_reply_through_the_remote_hop(call):
    _, _, path, seen = call
    caller = Caller(path)
    caller.say(speak(QUESTION, SAMPLE_RATE, before_ms=300, after_ms=1200))
    completed = lambda: any(isinstance(e, p.ResponseDone) and e.status == "completed" for e in seen)  # noqa: E731
    await caller.run_until(lambda: completed() and not path.playout.playing, timeout=25)
    said = words(transcribe(caller.audio(), SAMPLE_RATE))
    assert said[:2] == ["you", "said"] and {"book", "table"} <= set(said), said
    assert path.figures.last("turn_ms") is not None


async def test_talking_over_the_agent_stops_playout_and_the_server_keeps_only_what_was_heard(call):
    plugin, conversation, path, _ = call
    caller = Caller(path)
    caller.say(speak(LONG, SAMPLE_RATE, before_ms=300, after_ms=1200))
    await caller.run_until(lambda: path.state == "speaking", timeout=30)
    await caller.run_until(lambda: sum(f.any() for f in caller.heard) >= 60, timeout=20)  # 1.2 s of the reply (a loaded machine synthesises slower)

    caller.say(speak("Wait, stop please.", SAMPLE_RATE, after_ms=1200))
    interrupted_at = len(caller.heard)
    await caller.run_until(lambda: path.barge_ins == 1, timeout=10)
    barge_in_ms = path.figures.last("barge_in_ms")
    assert barge_in_ms is not None and barge_in_ms < 400
    await caller.run_until(lambda: len(caller.heard) > interrupted_at + 40, timeout=10)
    assert not any(f.any() for f in caller.heard[-25:])  # the agent stays quiet while the caller talks

    history = plugin.context(conversation.session_id).history
    await caller.run_until(lambda: any(h["role"] == "assistant" for h in history), timeout=20)
    kept = words(next(h["content"] for h in history if h["role"] == "assistant"))
    full = words("You said: " + LONG)
    assert kept and kept == full[: len(kept)] and len(kept) < len(full) // 2, kept
