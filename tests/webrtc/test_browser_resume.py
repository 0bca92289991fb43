"""The page in headless Chromium comes back to the same conversation after its connection goes."""

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


async def test_the_page_resumes_its_conversation_after_a_blip_and_hangs_up_for_good(host_address, speech_wav):
    backend = EchoBackend()
    app = web.Application()
    register_frontend_routes(app)
    registry = register_webrtc_routes(app, backend, host_address=host_address, resume_grace_s=30)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    browser = await asyncio.to_thread(Browser, fake_mic_wav=speech_wav)
    try:
        await asyncio.to_thread(browser.open, f"http://127.0.0.1:{server.port}/")
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 15)
        [first] = list(registry.sessions.values())
        await first.pc.close()  # the network goes: the server's end of the connection is gone
        await until(lambda: any(s is not first for s in registry.sessions.values()), 20, "the page to come back")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 15)
        await asyncio.to_thread(browser.wait_for_text, "agent-state", "speaking", 15)  # the echo flows again
        assert len(backend.conversations) == 1 and backend.conversations[0].closed_reason is None
        await asyncio.to_thread(browser.click, "connect")  # hang up on purpose
        await until(lambda: backend.conversations[0].closed_reason is not None, 10, "the conversation to end")
        assert backend.conversations[0].closed_reason == "client_close"
        assert not app[WEBRTC_PEERS].sessions
    finally:
        await asyncio.to_thread(browser.close)
        await registry.close_all()
        await server.close()
