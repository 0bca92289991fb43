"""Headless Chromium, a WAV as its microphone, talks to the embedded worker and its reference model."""

from __future__ import annotations

import asyncio

import pytest

from devtools.speech import speak, write_wav
from tests.webrtc.browser import Browser, chromium_missing_reason

pytestmark = pytest.mark.skipif(chromium_missing_reason() is not None, reason=str(chromium_missing_reason()))


@pytest.fixture
def question_wav(tmp_path):
    audio = speak("Please book a table for two people tonight.", 48000, before_ms=1000, after_ms=4000)
    return write_wav(tmp_path / "question.wav", audio, 48000)


async def test_one_exchange_in_the_page(reference_worker, question_wav):
    http, backend, _, _ = reference_worker
    url = str(http.make_url("/"))
    browser = await asyncio.to_thread(Browser, fake_mic_wav=question_wav)
    try:
        await asyncio.to_thread(browser.open, url)
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 20)
        transcript = await asyncio.to_thread(browser.wait_for_text, "transcript", "You said", 40)
        await asyncio.to_thread(browser.wait_for_text, "fig-turn", "ms", 20)
        # The picture shows the exchange over: the reply has played out.
        await asyncio.to_thread(browser.wait_for_text, "agent-state", "listening", 30)
        shot = await asyncio.to_thread(browser.screenshot, "e2e-reference-exchange")
        assert "table" in transcript.lower(), transcript  # the user's words and the echo
        assert shot.exists()
    finally:
        await asyncio.to_thread(browser.close)
