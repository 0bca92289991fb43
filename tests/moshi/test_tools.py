"""Moshi cannot call tools: a session that asks for them gets a typed error, never silence."""

from __future__ import annotations

from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.plugins.moshi.configs import SAMPLE_RATE
from tests.moshi.test_serving import tiny_settings
from tests.runtime.drivers import RunnerDriver

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


async def test_tools_are_refused_with_tools_unsupported():
    backend = build_backend(tiny_settings(max_sessions=1))
    driver = await RunnerDriver.open(backend)
    try:
        assert not driver.runner.capabilities.supports_tools
        session = {"turn_detection": None, "input_sample_rate": SAMPLE_RATE}
        await driver.send({"type": "session.update", "event_id": "evt_open", "session": {**session, "tools": [WEATHER]}})
        error, _ = await driver.until("error", timeout=30)
        assert error["error"]["code"] == "tools_unsupported" and error["error"]["event_id"] == "evt_open"
        assert "moshi" in error["error"]["message"]
        # Without tools the session opens; a response.create that brings some is refused the same way.
        await driver.send({"type": "session.update", "session": session})
        created, _ = await driver.until("session.created", timeout=30)
        assert created["session"]["capabilities"]["supports_tools"] is False
        await driver.send({"type": "response.create", "event_id": "evt_resp", "response": {"tools": [WEATHER]}})
        error, _ = await driver.until("error", timeout=30)
        assert error["error"]["code"] == "tools_unsupported" and error["error"]["event_id"] == "evt_resp"
    finally:
        await driver.close()
        await backend.close()
