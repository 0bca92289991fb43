"""Headless Chromium against the real worker: a phone-sized page over HTTPS from this machine's
own address (self-signed, trusted by its key's hash) talks to the reference model with a
session token; over plain HTTP the page says why the microphone is unavailable; a page from
another origin can neither open the realtime websocket nor signal. Screenshots: artifacts/."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from devtools.speech import speak, write_wav
from duplex_agent.agent.app.server import build_app, start_http, tls_certificate
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from tests.webrtc.browser import Browser, chromium_missing_reason

pytestmark = pytest.mark.skipif(chromium_missing_reason() is not None, reason=str(chromium_missing_reason()))
PHONE_WINDOW = "--window-size=390,844"


def wait_until_text(browser: Browser, element_id: str, condition, timeout: float) -> str:
    """Wait until ``condition(text of the element)`` holds; returns the text."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser.driver, timeout, poll_frequency=0.1).until(lambda _: condition(browser.text(element_id)))
    return browser.text(element_id)


def as_phone(browser: Browser) -> Browser:
    """A phone's viewport (390 x 844 CSS px, touch, mobile layout): headless windows are wider than phones."""
    browser.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
    browser.driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True})
    return browser


@pytest.fixture
def question_wav(tmp_path):
    audio = speak("Please book a table for two people tonight.", 48000, before_ms=1000, after_ms=4000)
    return write_wav(tmp_path / "question.wav", audio, 48000)


@pytest.fixture
async def reference_backend():
    from duplex_agent.plugins.reference.plugin import ReferencePlugin

    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    yield backend
    await backend.close()


async def _serve(backend, settings: Settings, port: int) -> web.AppRunner:
    return await start_http(build_app(backend, settings), "0.0.0.0", port)


async def test_a_phone_talks_to_the_worker_over_https_with_a_session_token(
        reference_backend, question_wav, host_address, free_port, tmp_path, monkeypatch, api_key):
    monkeypatch.setenv("DUPLEX_TLS_SELF_SIGNED", "1")
    monkeypatch.setenv("DUPLEX_TLS_DIR", str(tmp_path / "tls"))
    settings = Settings.from_env()
    settings.ice_address = host_address
    runner = await _serve(reference_backend, settings, free_port)
    spki = tls_certificate(settings).spki_sha256_base64()
    browser = None
    try:
        import aiohttp

        base = f"https://{host_address}:{free_port}"
        # The page's server (here: the test) holds the key and mints a token; the browser gets only the token.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http, \
                http.post(base + "/api/token", json={"ttl_s": 120},
                          headers={"Authorization": f"Bearer {api_key}"}) as minted:
            assert minted.status == 200
            token = (await minted.json())["token"]
        browser = await asyncio.to_thread(
            Browser, fake_mic_wav=question_wav,
            extra_args=(PHONE_WINDOW, f"--ignore-certificate-errors-spki-list={spki}"))
        await asyncio.to_thread(as_phone, browser)
        await asyncio.to_thread(browser.open, f"{base}/")  # without a token: the page says what it needs
        await asyncio.to_thread(browser.wait_for_text, "notice", "needs a session token", 10)
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "error", "this route needs credentials", 30)
        assert reference_backend.active_sessions == 0
        await asyncio.to_thread(browser.screenshot, "security-phone-https-without-token")
        await asyncio.to_thread(browser.open, f"{base}/#token={token}")
        assert await asyncio.to_thread(browser.driver.execute_script, "return window.isSecureContext")
        assert await asyncio.to_thread(browser.driver.execute_script, "return window.innerWidth") == 390
        assert token not in await asyncio.to_thread(lambda: browser.driver.current_url)  # taken out of the bar
        await asyncio.to_thread(browser.click, "connect")
        await asyncio.to_thread(browser.wait_for_text, "status", "Connected", 30)
        await asyncio.to_thread(browser.wait_for_text, "transcript", "You said", 60)
        await asyncio.to_thread(browser.wait_for_text, "fig-turn", "ms", 30)
        transcript = await asyncio.to_thread(wait_until_text, browser, "transcript",
                                             lambda text: text.lower().count("table") == 2, 60)
        shot = await asyncio.to_thread(browser.screenshot, "security-phone-https-exchange")
        assert transcript.lower().count("table") == 2, transcript  # the caller's words, and the echo
        assert shot.exists()
    finally:
        if browser is not None:
            await asyncio.to_thread(browser.close)
        await runner.cleanup()


async def test_over_plain_http_on_the_lan_the_page_says_why_the_microphone_is_unavailable(
        question_wav, host_address, free_port, monkeypatch):
    from duplex_agent.plugins.scripted import ScriptedPlugin

    monkeypatch.delenv("DUPLEX_API_KEY", raising=False)
    plugin = ScriptedPlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    runner = await _serve(backend, Settings(ice_address=host_address), free_port)
    browser = await asyncio.to_thread(Browser, fake_mic_wav=question_wav, extra_args=(PHONE_WINDOW,))
    try:
        await asyncio.to_thread(as_phone, browser)
        await asyncio.to_thread(browser.open, f"http://{host_address}:{free_port}/")
        notice = await asyncio.to_thread(browser.wait_for_text, "notice", "microphone is unavailable", 10)
        assert "HTTPS" in notice and "--tls-self-signed" in notice
        await asyncio.to_thread(browser.click, "connect")
        error = await asyncio.to_thread(browser.wait_for_text, "error", "microphone is unavailable", 10)
        assert "plain HTTP" in error
        await asyncio.to_thread(browser.screenshot, "security-phone-plain-http")
        assert backend.active_sessions == 0
    finally:
        await asyncio.to_thread(browser.close)
        await runner.cleanup()
        await backend.close()


PROBE = """
const [target, done] = arguments;
const result = {};
const ws = new WebSocket(target.replace("http", "ws") + "/v1/realtime?duplex=1");
ws.onopen = () => ws.send(JSON.stringify({type: "session.update", session: {}}));
ws.onmessage = (m) => { result.ws = JSON.parse(m.data).type; ws.close(); finish(); };
ws.onerror = () => { result.ws = "refused"; finish(); };
fetch(target + "/api/offer", {method: "POST", body: "{}", headers: {"Content-Type": "text/plain"}})
  .then((r) => { result.offer = r.status; finish(); }, () => { result.offer = "refused"; finish(); });
function finish() { if ("ws" in result && "offer" in result) done(result); }
"""


async def test_a_page_from_another_origin_cannot_drive_the_worker(host_address, free_port, caplog):
    from duplex_agent.plugins.scripted import ScriptedPlugin

    caplog.set_level(logging.INFO, logger="duplex_agent.access")
    plugin = ScriptedPlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    worker = await start_http(build_app(backend, Settings(ice_address=host_address)), "127.0.0.1", free_port)
    async def another_site(_request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>another site</title>", content_type="text/html")

    other = web.Application()
    other.router.add_get("/", another_site)
    other_runner = web.AppRunner(other)
    await other_runner.setup()
    other_site = web.TCPSite(other_runner, "127.0.0.1", 0)
    await other_site.start()
    other_port = other_runner.addresses[0][1]
    target = f"http://127.0.0.1:{free_port}"
    browser = await asyncio.to_thread(Browser, extra_args=(PHONE_WINDOW,))
    try:
        await asyncio.to_thread(browser.driver.set_script_timeout, 20)
        await asyncio.to_thread(browser.open, f"http://127.0.0.1:{other_port}/")
        foreign = await asyncio.to_thread(browser.driver.execute_async_script, PROBE, target)
        assert foreign == {"ws": "refused", "offer": "refused"}, foreign
        assert backend.active_sessions == 0
        refusals = [r.getMessage() for r in caplog.records if r.name == "duplex_agent.access"]
        assert any("refused GET /v1/realtime" in m and f"127.0.0.1:{other_port}" in m for m in refusals), refusals
        assert any("refused POST /api/offer" in m for m in refusals), refusals

        await asyncio.to_thread(browser.open, target + "/")
        own = await asyncio.to_thread(browser.driver.execute_async_script, PROBE, target)
        assert own == {"ws": "session.created", "offer": 400}, own  # the offer reached signaling: a bad body
    finally:
        await asyncio.to_thread(browser.close)
        await worker.cleanup()
        await other_runner.cleanup()
        await backend.close()
