"""The page's LiveKit mode in headless Chromium (livekit-client) against the loopback LiveKit server.

The page gets a dev token from our token routes, joins the room, publishes a
microphone (a WAV of Piper speech), and shows what the agent in the room sends
back: its audio track, its ``lk.agent.state`` attribute and ``lk.transcription``
text streams. The agent is the real worker (``duplex-agent start``) dispatched
by the token's room configuration.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from devtools.speech import speak, write_wav
from duplex_agent.frontend import livekit_client_path, register_frontend_routes
from duplex_agent.webrtc.livekit.tokens import register_livekit_token_routes
from tests.livekit.conftest import AGENT_NAME
from tests.support.waits import until
from tests.webrtc.browser import Browser, chromium_missing_reason

QUESTION = "Please book a table for two people tonight."

needs_browser = pytest.mark.skipif(
    chromium_missing_reason() is not None or livekit_client_path() is None,
    reason=str(chromium_missing_reason() or "livekit-client is not installed (npm ci --prefix frontend)"),
)

#: Console output of the page, kept in the page itself (read back on failure).
CONSOLE_CAPTURE = """
window.__console = [];
for (const level of ["log", "info", "warn", "error", "debug"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    try { window.__console.push(level + ": " + args.map((a) => a instanceof Error ? a.stack || a.message
      : typeof a === "object" ? JSON.stringify(a) : String(a)).join(" ")); } catch (e) {}
    original(...args);
  };
}
window.addEventListener("error", (e) => window.__console.push("uncaught: " + e.message));
window.addEventListener("unhandledrejection", (e) => window.__console.push("unhandled: " + (e.reason && e.reason.message || e.reason)));
"""


# ---- the token routes (no browser) ----

async def _token_client(**config) -> TestClient:
    app = web.Application()
    register_livekit_token_routes(app, **config)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def test_token_routes_mint_a_room_token_that_dispatches_the_agent():
    from livekit import api

    client = await _token_client(url="ws://127.0.0.1:7880", api_key="devkey", api_secret="devsecret-0123456789",
                                 agent_name="duplex-agent")
    try:
        config = await (await client.get("/api/livekit/config")).json()
        assert config == {"enabled": True, "url": "ws://127.0.0.1:7880", "agent_name": "duplex-agent"}
        response = await client.post("/api/livekit/token", json={"room": "room-1", "identity": "alice"})
        assert response.status == 200
        body = await response.json()
        assert body["url"] == "ws://127.0.0.1:7880" and body["room"] == "room-1" and body["identity"] == "alice"
        claims = api.TokenVerifier("devkey", "devsecret-0123456789").verify(body["token"])
        assert claims.identity == "alice"
        assert claims.video.room_join and claims.video.room == "room-1"
        assert claims.video.can_publish and claims.video.can_subscribe and claims.video.can_publish_data
        assert [a.agent_name for a in claims.room_config.agents] == ["duplex-agent"]

        for bad in (b"{not json", b"[1, 2]", json.dumps({"room": "r"}).encode(),
                    json.dumps({"room": "r", "identity": 7}).encode(),
                    json.dumps({"room": "has space", "identity": "alice"}).encode(),
                    json.dumps({"room": "", "identity": "alice"}).encode()):
            response = await client.post("/api/livekit/token", data=bad, headers={"Content-Type": "application/json"})
            assert response.status == 400, bad
            assert (await response.json())["error"]["message"]
    finally:
        await client.close()


async def test_token_routes_without_credentials_say_so():
    client = await _token_client(url="", api_key="", api_secret="", agent_name="duplex-agent")
    try:
        config = await (await client.get("/api/livekit/config")).json()
        assert config["enabled"] is False and config["url"] is None
        response = await client.post("/api/livekit/token", json={"room": "room-1", "identity": "alice"})
        assert response.status == 404
        assert "LIVEKIT_URL" in (await response.json())["error"]["message"]
    finally:
        await client.close()


# ---- the page ----

@pytest.fixture
def question_wav(tmp_path):
    audio = speak(QUESTION, 48000, before_ms=3000, after_ms=8000)
    return write_wav(tmp_path / "question.wav", audio, 48000)


@pytest.fixture
async def page_url(livekit_server):
    """Our page and token routes on 127.0.0.1 (a secure context), minting for the loopback server."""
    app = web.Application()
    register_frontend_routes(app)
    register_livekit_token_routes(app, url=livekit_server.url, api_key=livekit_server.api_key,
                                  api_secret=livekit_server.api_secret, agent_name=AGENT_NAME)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}/"
    await server.close()


def _open_browser(wav=None) -> Browser:
    browser = Browser(fake_mic_wav=wav)
    browser.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CONSOLE_CAPTURE})
    return browser


def _console(browser: Browser) -> str:
    try:
        return "\n".join(browser.driver.execute_script("return window.__console || []")[-80:])
    except Exception as exc:  # the page is gone
        return f"(no console: {exc})"


def _set_value(browser: Browser, element_id: str, value: str) -> None:
    browser.driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input'));", element_id, value)


def _transcript(browser: Browser) -> list[tuple[str, str, str]]:
    """(class, speaker label, text) of each transcript line."""
    return browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('#transcript li'), (li) => [li.className,"
        " li.querySelector('.speaker').textContent, li.querySelector('.text').textContent]);")


def _closed_port() -> int:
    """A 127.0.0.1 port that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _participants(livekit_server, room: str) -> list[str]:
    return list(livekit_server.rooms[room].participants) if room in livekit_server.rooms else []


async def _in_thread(function, *args):
    return await asyncio.to_thread(function, *args)


@needs_browser
async def test_page_talks_with_the_dispatched_worker_over_livekit(livekit_server, start_worker, page_url,
                                                                   question_wav):
    worker = await start_worker()
    await livekit_server.wait_for_worker(AGENT_NAME, available=True, timeout=90)
    browser = await _in_thread(_open_browser, question_wav)
    try:
        await _in_thread(browser.open, page_url)
        await _in_thread(browser.click, "mode-livekit")
        await _in_thread(browser.wait_for_text, "lk-get-token", "Get a dev token", 10)
        await _in_thread(_set_value, browser, "lk-room", "browser-call")
        await _in_thread(browser.click, "lk-get-token")
        await _in_thread(browser.wait_for_text, "lk-token-info", "Room browser-call as caller-", 10)
        await _in_thread(browser.click, "connect")
        await _in_thread(browser.wait_for_text, "connect", "Disconnect", 30)
        # The token's room configuration dispatched the worker to the room.
        await until(lambda: any(d.room == "browser-call" and d.agent_name == AGENT_NAME
                                   for d in livekit_server.dispatches.values()), 10, "the dispatch")
        await _in_thread(browser.wait_for_text, "status", "Connected", 30)
        await _in_thread(browser.wait_for_text, "agent-state", "listening", 30)
        transcript = await _in_thread(browser.wait_for_text, "transcript", "You said", 60)
        await _in_thread(browser.wait_for_text, "fig-rtt", "ms", 10)
        lines = await _in_thread(_transcript, browser)
        # The picture shows the exchange over: the reply has played out.
        await _in_thread(browser.wait_for_text, "agent-state", "listening", 30)
        # The figures come from the agent's attributes; the page says why the settings are absent.
        await _in_thread(browser.wait_for_text, "fig-turn", "ms", 30)
        assert "data channel" in await _in_thread(browser.text, "livekit-settings-note")
        assert await _in_thread(browser.text, "model-notice") == ""  # real weights: no notice
        await _in_thread(browser.screenshot, "livekit-page-exchange")
        await _in_thread(browser.driver.set_window_size, 390, 844)
        await _in_thread(browser.screenshot, "livekit-page-exchange-phone")

        users = [text for kind, speaker, text in lines if kind.split()[0] == "user" and speaker == "You"]
        agents = [text for kind, speaker, text in lines if kind.split()[0] == "agent" and speaker == "Agent"]
        assert len(users) + len(agents) == len(lines), lines  # every line says who spoke
        assert users and "table" in users[0].lower(), lines
        assert agents and agents[0].startswith("You said"), lines
        assert "table" in transcript.lower()
        # The agent's voice reached the page's <audio> element.
        playing = await _in_thread(browser.driver.execute_script,
                                   "const a = document.getElementById('agent-audio');"
                                   "return Boolean(a.srcObject) && a.srcObject.getAudioTracks().length > 0;")
        assert playing

        await _in_thread(browser.click, "connect")  # disconnect
        await _in_thread(browser.wait_for_text, "connect", "Connect", 10)
        await until(lambda: not any(identity.startswith("caller-") for identity in _participants(
            livekit_server, "browser-call")), 15, "the page to leave the room")
        # livekit-client asks for /rtc/v1 first, as the worker's SDK does: both were served there,
        # nothing either asked for got a 404 (the browser's console would show it as an error).
        await until(lambda: sum(r[1] == "/rtc/v1" for r in livekit_server.http_requests()) >= 2, 15,
                       "the page's and the agent's signal connections to end")
        requests = livekit_server.http_requests()
        assert not [r for r in requests if r[2] == 404], requests
        assert not [r for r in requests if r[1] == "/rtc"], requests
    except BaseException:
        print("--- page console ---\n" + await _in_thread(_console, browser))
        print("--- worker log (tail) ---\n" + worker.log()[-4000:])
        raise
    finally:
        await _in_thread(browser.close)


@needs_browser
async def test_page_says_when_the_livekit_agent_has_random_weights(livekit_server, start_worker, page_url):
    """A worker serving Moshi's tiny config: its agent says so in an attribute, and the page shows it."""
    pytest.importorskip("moshi", reason="the moshi package is not installed (make install-moshi)")
    worker = await start_worker(plugin="moshi", max_sessions=1, extra=("--moshi-config", "tiny", "--device", "cpu"))
    await livekit_server.wait_for_worker(AGENT_NAME, available=True, timeout=120)
    browser = await _in_thread(_open_browser)
    try:
        await _in_thread(browser.open, page_url)
        await _in_thread(browser.click, "mode-livekit")
        await _in_thread(browser.wait_for_text, "lk-get-token", "Get a dev token", 10)
        await _in_thread(_set_value, browser, "lk-room", "random-weights")
        await _in_thread(browser.click, "lk-get-token")
        await _in_thread(browser.wait_for_text, "lk-token-info", "Room random-weights as caller-", 10)
        assert await _in_thread(browser.text, "model-notice") == ""
        await _in_thread(browser.click, "connect")
        await _in_thread(browser.wait_for_text, "status", "Connected", 60)
        notice = await _in_thread(browser.wait_for_text, "model-notice", "random weights", 60)
        assert "means nothing" in notice
        await _in_thread(browser.screenshot, "livekit-page-random-weights")
        await _in_thread(browser.click, "connect")  # disconnect
        await _in_thread(browser.wait_for_text, "connect", "Connect", 10)
    except BaseException:
        print("--- page console ---\n" + await _in_thread(_console, browser))
        print("--- worker log (tail) ---\n" + worker.log()[-4000:])
        raise
    finally:
        await _in_thread(browser.close)


@needs_browser
async def test_page_explains_a_bad_token_and_an_unreachable_server(livekit_server, page_url):
    from devtools.livekit_server import auth

    browser = await _in_thread(_open_browser)
    try:
        await _in_thread(browser.open, page_url + "#livekit")
        await _in_thread(browser.wait_for_text, "lk-get-token", "Get a dev token", 10)

        forged = auth.mint_token(livekit_server.api_key, "not-the-secret-of-this-server", "mallory", "room-x")
        await _in_thread(_set_value, browser, "lk-url", livekit_server.url)
        await _in_thread(_set_value, browser, "lk-token", forged)
        await _in_thread(browser.click, "connect")
        message = await _in_thread(browser.wait_for_text, "error", "refused the token", 30)
        assert "401" in message, message
        assert await _in_thread(browser.text, "status") == "Not connected"
        await _in_thread(browser.wait_for_text, "connect", "Connect", 5)
        await _in_thread(browser.driver.set_window_size, 800, 1000)
        await _in_thread(browser.screenshot, "livekit-page-bad-token")

        good = livekit_server.mint_token("bob", "room-x")
        nobody = f"ws://127.0.0.1:{_closed_port()}"
        await _in_thread(_set_value, browser, "lk-url", nobody)
        await _in_thread(_set_value, browser, "lk-token", good)
        await _in_thread(browser.click, "connect")
        message = await _in_thread(browser.wait_for_text, "error", "Could not reach the LiveKit server", 30)
        assert nobody in message

        await _in_thread(_set_value, browser, "lk-url", "not a url")
        await _in_thread(browser.click, "connect")
        await _in_thread(browser.wait_for_text, "error", "is not a LiveKit URL", 5)
        assert "room-x" not in livekit_server.rooms
    except BaseException:
        print("--- page console ---\n" + await _in_thread(_console, browser))
        raise
    finally:
        await _in_thread(browser.close)
