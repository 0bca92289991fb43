"""Headless Chromium, a WAV as its microphone, talks to the embedded worker and its reference model;
the page labels who said what, explains empty figures, and says when the model's weights are random."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.speech import speak, write_wav
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.webrtc.direct.host_address import interface_ipv4
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
        # Before a call the figures say when they will have a value.
        assert "once the agent has answered you" in await asyncio.to_thread(browser.text, "why-turn")
        assert "once you talk over the agent" in await asyncio.to_thread(browser.text, "why-barge")
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 20)
        transcript = await asyncio.to_thread(browser.wait_for_text, "transcript", "You said", 40)
        await asyncio.to_thread(browser.wait_for_text, "fig-turn", "ms", 20)
        # The picture shows the exchange over: the reply has played out.
        await asyncio.to_thread(browser.wait_for_text, "agent-state", "listening", 30)
        shot = await asyncio.to_thread(browser.screenshot, "e2e-reference-exchange")
        assert "table" in transcript.lower(), transcript  # the user's words and the echo
        assert shot.exists()
        lines = await asyncio.to_thread(transcript_lines, browser)
        assert lines[0][:2] == ("user", "You") and "table" in lines[0][2].lower(), lines
        assert ("agent", "Agent") in [line[:2] for line in lines], lines
        assert next(text for who, _, text in lines if who == "agent").startswith("You said"), lines
        assert await asyncio.to_thread(browser.text, "why-turn") == ""  # a figure now: no reason shown
        assert await asyncio.to_thread(browser.text, "model-notice") == ""  # real weights: no notice
    finally:
        await asyncio.to_thread(browser.close)


def transcript_lines(browser: Browser) -> list[tuple[str, str, str]]:
    """(class, speaker label, text) of each transcript line, as the page wrote them."""
    return [tuple(line) for line in browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('#transcript li'), (li) => [li.className.split(' ')[0],"
        " li.querySelector('.speaker').textContent, li.querySelector('.text').textContent]);")]


async def test_the_page_says_when_the_weights_are_random():
    """Moshi's tiny config (the moshi package's real code, random weights): the server says so in
    session.created's capabilities, and the page shows it."""
    pytest.importorskip("moshi", reason="the moshi package is not installed (make install-moshi)")
    from duplex_agent.agent.app.bootstrap import build_backend
    from duplex_agent.plugins.moshi.plugin import MoshiOptions

    backend = await asyncio.to_thread(build_backend, Settings(plugin="moshi", max_sessions=1,
                                                              plugin_options=MoshiOptions(moshi_config="tiny",
                                                                                          device="cpu")))
    assert backend.capabilities.random_weights
    client = TestClient(TestServer(build_app(backend, Settings(ice_address=interface_ipv4())), host="127.0.0.1"))
    await client.start_server()
    browser = await asyncio.to_thread(Browser)
    try:
        await asyncio.to_thread(browser.open, str(client.make_url("/")))
        assert await asyncio.to_thread(browser.text, "model-notice") == ""
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 30)
        notice = await asyncio.to_thread(browser.wait_for_text, "model-notice", "random weights", 30)
        assert "means nothing" in notice
        await asyncio.to_thread(browser.screenshot, "e2e-random-weights-notice")
        await asyncio.to_thread(browser.click, "connect")  # hang up: the notice goes with the call
        await asyncio.to_thread(browser.wait_for_text, "connect", "Connect", 10)
        assert await asyncio.to_thread(browser.text, "model-notice") == ""
    finally:
        await asyncio.to_thread(browser.close)
        await client.close()
        await backend.close()
