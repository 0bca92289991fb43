"""Dial requests are checked before anything is dialled; LiveKit's refusals map to one reason each."""

from __future__ import annotations

import argparse
import json

import pytest
from livekit import api

from duplex_agent.agent.app.dial_command import add_dial_arguments, dial_request
from duplex_agent.agent.telephony.dial_outcome import DialFailed
from duplex_agent.agent.telephony.dial_request import DialRequest, DialRequestError, dial_request_of
from duplex_agent.agent.telephony.quiet_answer import DEFAULT_QUIET_ANSWER_S
from duplex_agent.webrtc.livekit.sip_dial import create_request, place_call


def test_metadata_round_trip_and_the_livekit_request():
    request = DialRequest("+15551234567", "ST_abc", caller_id="+15550001111", dtmf="123w#",
                          ringing_timeout_s=12, max_duration_s=600, agent_speaks_first=True,
                          greeting="Hello, this is the clinic.", quiet_answer_s=2.5)
    assert dial_request_of(request.to_metadata()) == request
    create = create_request("room-1", request)
    assert (create.sip_call_to, create.sip_trunk_id, create.sip_number, create.dtmf) == \
        ("+15551234567", "ST_abc", "+15550001111", "123w#")
    assert create.wait_until_answered and create.participant_identity == "sip_+15551234567"
    assert create.ringing_timeout.seconds == 12 and create.max_call_duration.seconds == 600


def test_metadata_without_a_call_is_not_a_dial_job():
    assert dial_request_of("") is None
    assert dial_request_of("alice") is None
    assert dial_request_of(json.dumps({"caller": "alice"})) is None


@pytest.mark.parametrize(("fields", "says"), [
    ({"number": "5551234567", "trunk": "ST_a"}, "E.164"),
    ({"number": "+1555abc4567", "trunk": "ST_a"}, "E.164"),
    ({"number": "+15551234567", "trunk": ""}, "trunk"),
    ({"number": "+15551234567", "trunk": "ST_a", "dtmf": "12x"}, "'x'"),
    ({"number": "+15551234567", "trunk": "ST_a", "ringing_timeout_s": 0.1}, "ringing timeout"),
    ({"number": "+15551234567", "trunk": "ST_a", "quiet_answer_s": -1}, "quiet answer"),
    ({"number": "+15551234567", "trunk": "ST_a", "quiet_answer_s": 600}, "quiet answer"),
    ({"number": "+15551234567", "trunk": "ST_a", "voicemail": "leave_message"}, "message"),
    ({"number": "+15551234567", "trunk": "ST_a", "agent_speaks_first": "yes"}, "bool"),
    ({"number": "+15551234567", "trunk": "ST_a", "agent_speaks_first": True}, "needs the greeting"),
    ({"number": "+15551234567", "trunk": "ST_a", "voicemail": "leave_message", "voicemail_message": "x" * 1001},
     "over 1000 characters"),
    ({"number": "+15551234567", "trunk": "ST_a", "volume": 3}, "unknown dial fields: volume"),
    ({"trunk": "ST_a"}, "no number"),
])
def test_a_bad_request_says_what_to_fix(fields, says):
    with pytest.raises(DialRequestError, match=says):
        dial_request_of(json.dumps({"dial": fields}))


def test_the_dial_command_line_sets_the_quiet_answer_wait():
    parser = argparse.ArgumentParser()
    add_dial_arguments(parser)
    assert dial_request(parser.parse_args(["+15551234567", "--trunk", "ST_a"])).quiet_answer_s == DEFAULT_QUIET_ANSWER_S
    assert dial_request(parser.parse_args(["+15551234567", "--trunk", "ST_a", "--quiet-answer", "0"])).quiet_answer_s == 0
    with pytest.raises(DialRequestError, match="quiet answer"):
        dial_request(parser.parse_args(["+15551234567", "--trunk", "ST_a", "--quiet-answer", "-2"]))


class _RefusingSip:
    def __init__(self, exc: Exception) -> None:
        self._exc = exc

    async def create_sip_participant(self, create):
        raise self._exc


class _Api:
    def __init__(self, exc: Exception) -> None:
        self.sip = _RefusingSip(exc)


def _sip_error(code: int, status: str, twirp: str) -> api.SipCallError:
    return api.SipCallError(twirp, f"sip status {code}: {status}", status=429,
                            metadata={"sip_status_code": str(code), "sip_status": status})


@pytest.mark.parametrize(("exc", "reason", "sip_status"), [
    (_sip_error(486, "Busy Here", "resource_exhausted"), "busy", 486),
    (_sip_error(603, "Decline", "permission_denied"), "declined", 603),
    (_sip_error(480, "Temporarily Unavailable", "resource_exhausted"), "no_answer", 480),
    (_sip_error(404, "Not Found", "not_found"), "invalid_number", 404),
    (_sip_error(503, "Service Unavailable", "failed_precondition"), "failed", 503),
    (api.ServerError("canceled", "sip request timed out", status=408), "no_answer", None),
    (api.ServerError("not_found", "requested sip trunk does not exist", status=404), "unknown_trunk", None),
    (api.ServerError("unauthenticated", "permissions denied", status=401), "not_permitted", None),
    (TimeoutError(), "failed", None),
])
async def test_each_refusal_is_one_reason(exc, reason, sip_status):
    with pytest.raises(DialFailed) as failed:
        await place_call(_Api(exc), "room-1", DialRequest("+15551234567", "ST_abc"))  # type: ignore[arg-type]
    assert (failed.value.reason, failed.value.sip_status) == (reason, sip_status)
    assert "+15551234567" in str(failed.value) or "ST_abc" in str(failed.value)
