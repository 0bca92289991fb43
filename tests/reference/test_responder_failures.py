"""The reference model with ``--responder openai`` through the runner, against real local endpoints:
a port nothing listens on, a server that answers 500, and a stub that streams a reply.

An endpoint's failure reaches the caller as one plain sentence (the ``error`` event's message, which
the page shows) and the operator's log as a warning with the address and the reason in words; the
start-up check warns about an endpoint it cannot reach, and the worker starts anyway.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from devtools.speech import speak, words
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferenceOptions, ReferencePlugin
from tests.runtime.drivers import RunnerDriver
from tests.support.chat_stub import start_server, streaming_reply
from tests.support.ports import refused_port

RATE = 16000
QUESTION = "Please book a table for two people tonight."
KEY = "sk-secret-123"
#: Never in a log line or an event: the key, and the HTTP client's internals.
INTERNALS = ("ConnectionKey", "ClientConnectorError", "proxy_headers_hash", KEY)


@asynccontextmanager
async def reference_model(base_url: str) -> AsyncIterator[tuple[RunnerDriver, LocalBackend]]:
    """The reference model answering through ``base_url``, started as the worker starts it, and one session."""
    plugin = ReferencePlugin(as_float32_audio)
    plugin.configure(ReferenceOptions(responder="openai", openai_base_url=base_url, openai_model="m",
                                      openai_api_key=KEY), max_sessions=2)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    try:
        await backend.start()
        driver = await RunnerDriver.open(backend)
        await driver.send({"type": "session.update", "session": {"input_sample_rate": RATE}})
        await driver.until("session.created")
        try:
            yield driver, backend
        finally:
            await driver.close()
    finally:
        await backend.close()


async def failed_turn(driver: RunnerDriver) -> tuple[str, list[dict]]:
    """Ask a question; the error's message once the response has failed, and every event."""
    await driver.append(speak(QUESTION, before_ms=300, after_ms=1200))
    error, seen = await driver.until("error", timeout=60)
    done, more = await driver.until("response.done", timeout=10)
    assert error["error"]["code"] == "stage_failed" and done["status"] == "failed", seen + more
    text = str(seen + more)
    assert not [word for word in INTERNALS if word in text], text
    return error["error"]["message"], seen + more


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The log's warnings about the language model (others, such as slow synthesis on a busy machine, aside)."""
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines for word in INTERNALS if word in line], lines
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and "language model" in record.getMessage()]


async def test_an_endpoint_nothing_listens_on(caplog):
    caplog.set_level(logging.INFO)
    with refused_port() as port:
        address = f"http://127.0.0.1:{port}/v1"
        async with reference_model(address) as (driver, _):
            refused = "the connection was refused (is the server running, on that port?)"
            assert warnings_of(caplog) == [f"the language model at {address} cannot be reached: {refused}; "
                                           "starting anyway, and replies fail until that changes"]
            caplog.clear()
            message, _ = await failed_turn(driver)
            assert message == "The language model could not be reached."
            (line,) = warnings_of(caplog)
            assert line.endswith(f"stage 1 failed: the language model at {address}: {refused}"), line


async def test_an_endpoint_that_answers_500(caplog):
    caplog.set_level(logging.INFO)

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="the GPU fell over")

    runner, address = await start_server(broken)
    try:
        async with reference_model(address) as (driver, _):
            assert warnings_of(caplog) == []  # it answers (GET /models is a 404 here): nothing to warn about
            message, _ = await failed_turn(driver)
            assert message == "The language model answered with an error (HTTP 500)."
            (line,) = warnings_of(caplog)
            assert line.endswith(f"stage 1 failed: the language model at {address}: HTTP 500 from "
                                 f"{address}/chat/completions: the GPU fell over"), line
            # The session goes on: the next turn fails the same way, no worse.
            message, _ = await failed_turn(driver)
            assert message.endswith("(HTTP 500).")
    finally:
        await runner.cleanup()


async def test_an_endpoint_that_streams_a_reply_is_spoken(caplog):
    caplog.set_level(logging.INFO)
    asked: list[dict] = []
    runner, address = await start_server(streaming_reply(["Sure,", " a table", " for two", " is booked."], asked))
    try:
        async with reference_model(address) as (driver, _):
            await driver.append(speak(QUESTION, before_ms=300, after_ms=1200))
            done, seen = await driver.until("response.done", timeout=60)
    finally:
        await runner.cleanup()
    assert done["status"] == "completed" and not [e for e in seen if e["type"] == "error"], seen
    assert {"book", "table", "two"} <= set(words(asked[0]["messages"][-1]["content"]))
    (said,) = [e["transcript"] for e in seen if e["type"] == "response.output_audio_transcript.done"]
    assert said == "Sure, a table for two is booked."
    assert [e for e in seen if e["type"] == "response.output_audio.delta"]
    assert warnings_of(caplog) == []
