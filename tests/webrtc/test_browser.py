"""The page in headless Chromium against the real routes and the echo backend."""

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_agent.frontend import register_frontend_routes
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS, register_webrtc_routes
from tests.support.waits import until

from .browser import Browser, chromium_missing_reason
from .fakes import EchoBackend

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(chromium_missing_reason() is not None, reason=str(chromium_missing_reason())),
]


@pytest.fixture
async def page_server(host_address):
    backend = EchoBackend()
    app = web.Application()
    register_frontend_routes(app)
    register_webrtc_routes(app, backend, host_address=host_address)
    server = TestServer(app, host="127.0.0.1")  # a secure context for getUserMedia
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}/", app, backend
    await server.close()


async def test_page_connects_and_shows_the_agent_speaking(page_server, speech_wav):
    url, app, backend = page_server
    browser = await asyncio.to_thread(Browser, fake_mic_wav=speech_wav)
    try:
        await asyncio.to_thread(browser.open, url)
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 15)
        await asyncio.to_thread(browser.wait_for_text, "agent-state", "speaking", 15)  # the echo of the mic
        rtt = await asyncio.to_thread(browser.wait_for_text, "fig-rtt", "ms", 10)
        assert len(app[WEBRTC_PEERS].sessions) == 1
        await asyncio.to_thread(browser.screenshot, "webrtc-page-connected")
        await asyncio.to_thread(browser.driver.set_window_size, 390, 844)
        await asyncio.to_thread(browser.screenshot, "webrtc-page-connected-phone")
        print("page RTT figure:", rtt)
        await asyncio.to_thread(browser.click, "connect")  # disconnect
        await asyncio.to_thread(browser.wait_for_text, "connect", "Connect", 5)
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        # The page hung up on purpose: the conversation ends (it is not parked for a resume).
        await until(lambda: backend.conversations[0].closed_reason is not None, 10, "the conversation to end")
        assert backend.conversations[0].closed_reason == "client_close"
    finally:
        await asyncio.to_thread(browser.close)


async def test_refused_microphone_gets_a_clear_message(page_server):
    url, app, backend = page_server
    browser = await asyncio.to_thread(Browser, allow_microphone=False)
    try:
        await asyncio.to_thread(browser.open, url)
        await asyncio.to_thread(browser.click, "connect")
        message = await asyncio.to_thread(browser.wait_for_text, "error", "Microphone access was refused", 10)
        await asyncio.to_thread(browser.screenshot, "webrtc-page-mic-refused")
        assert "settings" in message
    finally:
        await asyncio.to_thread(browser.close)
    assert backend.conversations == []
