"""``duplex-agent serve`` drains on SIGTERM/SIGINT: live realtime sessions go on, new ones are
refused, what is left at the drain timeout closes with reason ``shutdown``, and it exits 0."""

from __future__ import annotations

import signal

import pytest

from tests.runtime.drivers import WebSocketDriver
from tests.support.audio import tone

MANUAL = {"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": 16000}}


async def _session(serve) -> WebSocketDriver:
    driver = await WebSocketDriver.open(serve.realtime_url)
    await driver.send(MANUAL)
    await driver.until("session.created", timeout=30)
    return driver


async def _exchange(driver: WebSocketDriver) -> dict:
    await driver.append(tone(300))
    await driver.send({"type": "input_audio_buffer.commit"})
    done, _ = await driver.until("response.done", timeout=30)
    return done


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_live_session_goes_on_until_it_ends_then_serve_exits_0(start_serve, sig):
    serve = await start_serve(plugin="scripted", drain_timeout=60)
    driver = await _session(serve)
    assert (await _exchange(driver))["status"] == "completed"

    serve.signal(sig)
    refused = await WebSocketDriver.open(serve.realtime_url)
    await refused.send(MANUAL)
    error, _ = await refused.until("error", timeout=30)
    assert error["error"]["code"] == "shutting_down"
    await refused.close()

    # The live session keeps talking while the worker drains, then ends the way a client ends a
    # session (a dropped socket would be kept for its resume grace, as vLLM-Omni keeps it).
    assert (await _exchange(driver))["status"] == "completed"
    await driver.send({"type": "session.close"})
    await driver.until("session.closed", timeout=30)
    await driver.close()
    assert await serve.exited(timeout=30) == 0  # long before the 60 s drain timeout


async def test_a_session_left_at_the_drain_timeout_closes_with_reason_shutdown(start_serve):
    serve = await start_serve(plugin="scripted", drain_timeout=2)
    driver = await _session(serve)
    serve.signal(signal.SIGTERM)
    closed, _ = await driver.until("session.closed", timeout=30)
    assert closed["reason"] == "shutdown"
    assert await serve.exited(timeout=30) == 0
    await driver.close()


async def test_a_second_signal_exits_at_once(start_serve):
    serve = await start_serve(plugin="scripted", drain_timeout=60)
    driver = await _session(serve)
    serve.signal(signal.SIGTERM)
    refused = await WebSocketDriver.open(serve.realtime_url)  # the first signal has been handled
    await refused.send(MANUAL)
    await refused.until("error", timeout=30)
    await refused.close()
    serve.signal(signal.SIGTERM)
    assert await serve.exited(timeout=10) == 128 + signal.SIGTERM  # the live session did not hold it
    await driver.close()
