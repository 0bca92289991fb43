"""A dial request that asks the agent to say something (a greeting first, a voicemail message)
is refused before anyone is dialled when the call's model cannot say a given text, with the
reason in the log, the room's events and /metrics."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from duplex_agent.agent import metrics
from duplex_agent.agent.app.outbound_call import dial_out
from duplex_agent.agent.telephony.dial_request import DialRequest
from duplex_agent.plugins.contract import DuplexCapabilities


class FakeCall:
    def __init__(self, speaks_given_text: bool) -> None:
        self.room = SimpleNamespace(name="room-1")
        self.backend = SimpleNamespace(capabilities=DuplexCapabilities(
            plugin_id="moshi", input_sample_rate=24000, unit_samples=1920, output_sample_rate=24000, max_sessions=1,
            speaks_given_text=speaks_given_text))
        self.told: list = []
        self.closed: str | None = None

    def tell_room(self, event) -> None:
        self.told.append(event)

    async def close(self, reason: str) -> None:
        self.closed = reason


class NoDialling:
    def __getattr__(self, name: str):
        raise AssertionError(f"nothing may be dialled (asked for {name})")


@pytest.mark.parametrize(("request_fields", "named"), [
    ({"agent_speaks_first": True, "greeting": "Hello!"}, "--agent-speaks-first"),
    ({"voicemail": "leave_message", "voicemail_message": "Call us back."}, "--voicemail leave_message"),
])
async def test_a_model_that_cannot_say_a_text_has_the_call_refused_before_dialling(request_fields, named, caplog):
    call = FakeCall(speaks_given_text=False)
    before = metrics.DIAL_OUTCOMES.labels("invalid_request")._value.get()
    with caplog.at_level(logging.ERROR, logger="duplex_agent.livekit"):
        await dial_out(NoDialling(), call, DialRequest("+15551234567", "ST_a", **request_fields))  # type: ignore[arg-type]
    assert call.closed == "dial_invalid_request"
    (event,) = call.told
    assert event.error["code"] == "dial_invalid_request" and named in event.error["message"]
    assert "'moshi' cannot say a given text" in caplog.text
    assert metrics.DIAL_OUTCOMES.labels("invalid_request")._value.get() == before + 1
