"""Answers to this side's own messages, by the exact event_id each was sent with (agent/remote/answers.py)."""

from __future__ import annotations

import json

from duplex_agent.agent.remote.answers import ExpectedAnswers, answered_id, error_code
from duplex_agent.agent.remote.outbox import Outgoing, Role, SentLog


def _error(event_id: object, code: str = "invalid_request") -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code, "event_id": event_id}}


def test_an_answer_goes_to_the_owner_of_the_exact_id_once():
    answers, got = ExpectedAnswers(), []
    answers.expect("evt_self_ack_1", lambda data: got.append(("ack", data)) is None)
    answers.expect("evt_self_ack_10", lambda data: got.append(("ack10", data)) is None)
    assert answers.take(_error("evt_self_ack_1"))
    assert [owner for owner, _ in got] == ["ack"]  # not the id it is a prefix of
    assert not answers.take(_error("evt_self_ack_1"))  # answered already: the next one goes on
    assert not answers.take(_error("evt_self_ack"))  # a prefix is no id
    assert len(answers) == 1


def test_messages_that_answer_nothing_of_ours_go_on():
    answers = ExpectedAnswers()
    answers.expect("evt_1", lambda data: True)
    assert not answers.take({"type": "session.heartbeat_ack", "session_id": "s"})
    assert not answers.take(_error("the_transports_own"))
    assert not answers.take({"type": "error", "code": "flat", "message": "a handshake error names no event"})
    assert len(answers) == 1


def test_an_owner_can_let_its_answer_go_on_to_the_transport():
    answers, seen = ExpectedAnswers(), []

    def probe_answered(data: dict) -> bool:
        seen.append(data["type"])
        return data["type"] == "error"

    answers.expect("evt_resume_probe_1", probe_answered)
    assert not answers.take({"type": "conversation.item.retrieved", "item": {"id": "evt_resume_probe_1"}})
    assert seen == ["conversation.item.retrieved"] and len(answers) == 0


def test_forgotten_and_oldest_expectations_are_dropped():
    answers = ExpectedAnswers(limit=2)
    for n in range(3):
        answers.expect(f"evt_{n}", lambda data: True)
    assert not answers.take(_error("evt_0"))  # the oldest went beyond the limit
    answers.forget("evt_1")
    assert not answers.take(_error("evt_1"))
    assert answers.take(_error("evt_2"))


def test_the_id_an_answer_names():
    assert answered_id(_error("evt_1")) == "evt_1"
    assert answered_id(_error(None)) is None and answered_id(_error(7)) is None
    assert answered_id({"type": "conversation.item.retrieved", "item": {"id": "item_1"}}) == "item_1"
    assert answered_id({"type": "response.done", "event_id": "evt_server"}) is None


def test_error_codes_nested_or_flat():
    assert error_code(_error("e", "item_not_found")) == "item_not_found"
    assert error_code({"type": "error", "code": "resource_exhausted"}) == "resource_exhausted"
    assert error_code({"type": "session.resumed"}) is None and error_code(None) is None


def test_a_receipt_answered_by_an_error_still_covers_what_was_written_before_it():
    answers = ExpectedAnswers()
    log = SentLog(receipt_every_ms=100.0, answers=answers)
    assert log.written(Outgoing("append-0", 40.0)) is None
    receipt = log.written(Outgoing("commit"))
    assert receipt is not None and receipt.role is Role.RECEIPT
    log.written(receipt)
    assert len(log) == 3 and len(answers) == 1
    assert answers.take(_error(json.loads(receipt.text)["event_id"]))  # the error stays here
    assert len(log) == 0
