"""A browser caller talks over the agent on the default page: the interruption stops the reply and
reaches the model whole, its first words too. Headless Chromium's microphone is a WAV (a question,
then an interruption while the reply plays); the embedded worker runs the reference model telling a
long story when asked, so the transcript is what Whisper heard of the audio the page sent. The browser's echo canceller, which the
page leaves off unless asked, mutes the start of such an interruption."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.browser_bargein import StoryPlugin
from devtools.speech import speak, write_wav
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.integration.test_browser_e2e import transcript_lines
from tests.webrtc.browser import Browser, chromium_missing_reason

pytestmark = pytest.mark.skipif(chromium_missing_reason() is not None, reason=str(chromium_missing_reason()))

RATE = 48000
QUESTION = "Tell me a story about the harbour."
INTERRUPTION = "Stop, please wait a moment. I have another question."
# From the question's end to the interruption: the worker's end of turn, Whisper and the story's first
# words, so the interruption lands while the story plays (it runs for half a minute).
LEAD_S = 5.0


@pytest.fixture
async def story_worker():
    """The embedded worker on loopback, its reference model telling a story when asked: the http client."""
    plugin = StoryPlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    client = TestClient(TestServer(build_app(backend, Settings(ice_address=interface_ipv4())), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()
    await backend.close()


@pytest.fixture
def talk_over_wav(tmp_path):
    question = speak(QUESTION, RATE, before_ms=2000)
    interruption = speak(INTERRUPTION, RATE, after_ms=15000)
    gap = np.zeros(int(LEAD_S * RATE), np.float32)
    return write_wav(tmp_path / "talk-over.wav", np.concatenate([question, gap, interruption]), RATE)


async def test_an_interruption_reaches_the_model_whole(story_worker, talk_over_wav):
    http = story_worker
    browser = await asyncio.to_thread(Browser, fake_mic_wav=talk_over_wav)
    try:
        await asyncio.to_thread(browser.open, str(http.make_url("/")))
        assert not await asyncio.to_thread(lambda: browser.driver.find_element("id", "echo-cancel").is_selected())
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 30)
        await asyncio.to_thread(browser.wait_for_text, "transcript", "another question", 90)
        # The worker's barge-in figure: it cut the reply while it played, not after it ended.
        await asyncio.to_thread(browser.wait_for_text, "fig-barge", "ms", 30)
        lines = await asyncio.to_thread(transcript_lines, browser)
    finally:
        await asyncio.to_thread(browser.close)
    said = [text for who, _, text in lines if who == "user"]
    assert len(said) >= 2 and "story" in said[0].lower(), lines
    heard = said[1].lower()
    assert heard.startswith("stop") and "please wait" in heard, said
