"""The edge tool runner on a virtual clock: each call runs once, bad input gets an error output
and the call goes on, after-heard tools wait for the words before them, the follow-up waits for
the caller, and a long wait gets the hold sound."""

from __future__ import annotations

import asyncio

import pytest

from duplex_agent.agent.metrics import REGISTRY
from duplex_agent.agent.protocol.events import (
    ConversationItemCreate,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
)
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY
from tests.support.virtual_time import run_virtual
from tests.tools.harness import ToolCall, call_events, spoken

FAILURES, CALLS = "duplex_tool_failures_total", "duplex_tool_calls_total"


def test_a_call_runs_once_and_its_answer_goes_back_before_the_follow_up():
    async def main():
        call = ToolCall()
        events = call_events("r1", "c1", "get_weather", '{"city": "Paris"}')
        call.feed(events)
        await call.settle()
        assert call.runs.calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
        assert call.output_of("c1") == "Sunny and 21 degrees in Paris"
        assert [type(e) for e in call.sent] == [ConversationItemCreate, ResponseCreate]
        # The same call again (a repeated event, a replay): nothing runs, nothing more is sent.
        call.feed(events)
        call.feed(events[4])
        await call.settle()
        assert len(call.runs.calls) == 1 and len(call.sent) == 2
        await call.runner.close()

    run_virtual(main())


def test_the_follow_up_waits_for_the_calls_response_to_end():
    async def main():
        call = ToolCall()
        events = call_events("r1", "c1", "get_weather", '{"city": "Oslo"}')
        call.feed(events[:-1])  # all but response.done
        await call.settle()
        assert call.output_of("c1") == "Sunny and 21 degrees in Oslo"
        assert call.follow_ups() == 0
        call.feed(events[-1])
        assert call.follow_ups() == 1
        await call.runner.close()

    run_virtual(main())


def test_a_model_that_replies_to_outputs_gets_no_follow_up():
    async def main():
        call = ToolCall(replies_to_tool_output=True)
        call.feed(call_events("r1", "c1", "count", '{"n": 4}'))
        await call.settle()
        assert call.output_of("c1") == '{"n": 4, "twice": 8}'
        assert call.follow_ups() == 0
        await call.runner.close()

    run_virtual(main())


@pytest.mark.parametrize(("name", "arguments", "code", "ran"), [
    ("book_flight", '{"to": "Rome"}', "unknown_tool", False),
    ("get_weather", '{"city": "Paris"', "invalid_arguments", False),  # not JSON (never repaired)
    ("get_weather", '["Paris"]', "invalid_arguments", False),
    ("get_weather", '{"unit": "celsius"}', "invalid_arguments", False),  # city is required
    ("count", '{"n": "many"}', "invalid_arguments", False),
    ("lookup_order", '{"number": "x"}', "invalid_arguments", False),  # a raw schema's type
    ("lookup_order", '{"number": 7, "extra": 1}', "invalid_arguments", False),
    ("broken", "{}", "tool_failed", True),
    ("refuse", '{"order": "A7"}', "tool_error", True),
    ("transfer", '{"to": "sip:desk"}', "needs_phone_call", True),  # the call cannot: the model is told so
])
def test_bad_input_gets_an_error_output_and_the_call_goes_on(name, arguments, code, ran):
    def counted(metric: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(metric, labels) or 0.0

    tool_label = "(unknown)" if code == "unknown_tool" else name
    failures, calls = counted(FAILURES, {"reason": code}), counted(CALLS, {"tool": tool_label})

    async def main():
        call = ToolCall()
        call.feed(call_events("r1", "c1", name, arguments))
        await call.settle()
        error = call.error_of("c1")
        assert error["code"] == code, error
        assert error["message"]
        assert bool(call.runs.calls) is ran
        assert counted(FAILURES, {"reason": code}) == failures + 1
        assert counted(CALLS, {"tool": tool_label}) == calls + 1
        assert call.follow_ups() == 1  # the model says something about it
        # The call goes on: the next call runs.
        call.feed(call_events("r2", "c2", "get_weather", '{"city": "Lima"}'))
        await call.settle()
        assert call.output_of("c2") == "Sunny and 21 degrees in Lima"
        await call.runner.close()

    run_virtual(main())


def test_a_tool_past_its_timeout_is_stopped_and_the_model_told():
    async def main():
        loop = asyncio.get_running_loop()
        call = ToolCall(timeout_s=2.0)
        started = loop.time()
        call.feed(call_events("r1", "c1", "slow_lookup", '{"seconds": 30}'))
        await asyncio.sleep(1.99)
        assert call.outputs() == []
        await asyncio.sleep(0.02)
        assert call.error_of("c1")["code"] == "tool_timeout"
        assert loop.time() - started == pytest.approx(2.01)
        assert call.follow_ups() == 1
        await call.runner.close()

    run_virtual(main())


def test_calls_past_the_limit_of_a_reply_are_refused_and_one_follow_up_asks_for_the_answer():
    async def main():
        call = ToolCall()
        for n in range(50):
            call.feed(call_events(f"r{n}", f"c{n}", "count", f'{{"n": {n}}}'))
        await call.settle()
        assert len(call.runs.calls) == MAX_CALLS_PER_REPLY
        assert len(call.outputs()) == 50
        refused = [n for n in range(50) if call.output_of(f"c{n}").startswith('{"error"')]
        assert refused == list(range(MAX_CALLS_PER_REPLY, 50))
        assert {call.error_of(f"c{n}")["code"] for n in refused} == {"too_many_calls"}
        assert call.follow_ups() == 1
        await call.runner.close()

    run_virtual(main())


def test_an_after_heard_tool_waits_until_the_words_before_it_are_heard():
    async def main():
        call = ToolCall()
        call.feed(SpeechStopped(1000.0))
        call.feed(spoken("r-say"))  # "I'll transfer you now", still playing
        call.feed(call_events("r-call", "c1", "transfer", '{"to": "tel:+15550100"}'))
        await call.settle()
        assert call.runs.calls == [] and call.outputs() == []
        call.runner.playback_ended("r-say", interrupted=False)
        await call.settle()
        assert call.runs.names() == ["transfer"]
        assert call.control.actions == [("transfer", "tel:+15550100")]
        assert call.output_of("c1") == "transferred to tel:+15550100"
        context = call.runs.contexts[0]
        assert (context.call, context.caller_identity, context.call_id) == ("the-room", "alice", "c1")
        await call.runner.close()

    run_virtual(main())


def test_an_after_heard_tool_talked_over_is_never_called_and_the_model_is_told():
    async def main():
        call = ToolCall()
        call.feed(SpeechStopped(1000.0))
        call.feed(spoken("r-say"))
        call.feed(call_events("r-call", "c1", "transfer", '{"to": "tel:+15550100"}'))
        await call.settle()
        # The caller barges in on the announcement: the call path cuts it short.
        call.feed(SpeechStarted(3000.0))
        call.runner.playback_ended("r-say", interrupted=True)
        await call.settle()
        assert call.runs.calls == [] and call.control.actions == []
        error = call.error_of("c1")
        assert error["code"] == "caller_interrupted" and "transfer was not run" in error["message"]
        assert call.follow_ups() == 0  # not while the caller speaks
        await call.runner.close()

    run_virtual(main())


def test_a_reply_cut_in_an_earlier_turn_does_not_stop_a_later_call():
    async def main():
        call = ToolCall()
        call.feed(spoken("r-old"))
        call.runner.playback_ended("r-old", interrupted=True)
        call.feed(SpeechStopped(2000.0))  # the caller's next turn: "yes, transfer me"
        call.feed(call_events("r-call", "c1", "transfer", '{"to": "tel:+15550100"}'))
        await call.settle()
        assert call.runs.names() == ["transfer"]
        await call.runner.close()

    run_virtual(main())


def test_talking_over_a_running_tool_does_not_cancel_it_and_the_follow_up_waits_for_the_caller():
    async def main():
        call = ToolCall()
        call.feed(call_events("r1", "c1", "wait_for_release", "{}"))
        await call.settle()
        call.feed(SpeechStarted(5000.0))
        await asyncio.sleep(1.0)
        call.runs.release.set()
        await call.settle()
        assert call.runs.cancelled == []
        assert call.output_of("c1") == "released"  # into the history at once
        assert call.follow_ups() == 0
        call.feed(SpeechStopped(7000.0))
        # The model has a moment to reply to the caller's turn by itself; it does not, so the
        # follow-up asks for the answer.
        await asyncio.sleep(0.74)
        assert call.follow_ups() == 0
        await asyncio.sleep(0.02)
        assert call.follow_ups() == 1
        await call.runner.close()

    run_virtual(main())


def test_no_follow_up_when_the_model_answers_the_callers_new_turn_itself():
    async def main():
        call = ToolCall()
        call.feed(call_events("r1", "c1", "wait_for_release", "{}"))
        await call.settle()
        call.feed(SpeechStarted(5000.0))
        call.runs.release.set()
        await call.settle()
        call.feed(SpeechStopped(7000.0))
        call.feed(ResponseCreated("r-turn", "item-turn"))  # the reply to the caller's turn
        await asyncio.sleep(2.0)
        call.feed(ResponseDone("r-turn", "completed"))
        await asyncio.sleep(2.0)
        assert call.follow_ups() == 0
        await call.runner.close()

    run_virtual(main())


def test_the_question_that_led_to_the_call_costs_the_follow_up_no_wait():
    """The caller's own question ended before the call: the grace for a reply of the model's own is
    only for a turn the caller ends during the wait, so the answer is asked for at once."""
    async def main():
        call = ToolCall()
        call.feed([SpeechStarted(0.0), SpeechStopped(1500.0)])
        call.feed(ResponseCreated("r-turn", "item-turn"))  # the question's reply, which makes the call
        await asyncio.sleep(0.3)  # the model hears the question and decides to call
        call.feed(call_events("r1", "c1", "get_weather", '{"city": "Paris"}'))
        call.feed(ResponseDone("r-turn", "completed"))
        await call.settle()
        assert call.output_of("c1") == "Sunny and 21 degrees in Paris"
        assert call.follow_ups() == 1  # no virtual time passed since the output
        await call.runner.close()

    run_virtual(main())


def test_a_long_wait_gets_the_hold_sound_until_the_answer_is_heard_and_not_over_the_caller():
    async def main():
        loop = asyncio.get_running_loop()
        call = ToolCall(hold_after_s=1.5)
        start = loop.time()
        call.feed(call_events("r1", "c1", "slow_lookup", '{"seconds": 5}'))
        await asyncio.sleep(1.49)
        assert not call.hold.sounding
        await asyncio.sleep(0.02)
        assert call.hold.sounding
        call.feed(SpeechStarted(9000.0))
        assert not call.hold.sounding  # quiet while the caller speaks
        call.feed(SpeechStopped(9500.0))
        assert call.hold.sounding
        await asyncio.sleep(4.0)  # the tool answers at 5 s; its answer has not started yet
        assert call.output_of("c1") == "found after 5 s"
        await asyncio.sleep(1.0)
        assert call.hold.sounding
        call.feed(spoken("r-answer", done=False))  # the answer's first audio
        assert not call.hold.sounding
        assert [round(t - start, 2) for t, _ in call.hold.changes] == [1.5, 1.51, 1.51, 6.51]
        await call.runner.close()

    run_virtual(main())


def test_a_quick_answer_plays_no_hold_sound():
    async def main():
        call = ToolCall(hold_after_s=1.5)
        call.feed(call_events("r1", "c1", "slow_lookup", '{"seconds": 0.5}'))
        await asyncio.sleep(0.6)
        call.feed(spoken("r-answer"))
        await asyncio.sleep(5.0)
        assert call.hold.changes == []
        await call.runner.close()

    run_virtual(main())


def test_a_tool_that_asks_for_no_reply_gets_no_follow_up_and_no_hold():
    async def main():
        call = ToolCall(hold_after_s=0.0)
        call.feed(call_events("r1", "c1", "quiet", "{}"))
        await call.settle()
        assert call.output_of("c1") == ""
        assert call.follow_ups() == 0
        await asyncio.sleep(2.0)
        assert not call.hold.sounding
        await call.runner.close()

    run_virtual(main())


def test_closing_lets_a_tool_that_is_about_to_answer_answer():
    # A hang-up or a transfer ends the call while its tool is still returning: that is no failure.
    cancelled = REGISTRY.get_sample_value(FAILURES, {"reason": "tool_cancelled"}) or 0.0

    async def main():
        call = ToolCall()
        call.feed(call_events("r1", "c1", "slow_lookup", '{"seconds": 0.3}'))
        await call.settle()
        await call.runner.close()
        assert call.output_of("c1") == "found after 0.3 s"
        assert (REGISTRY.get_sample_value(FAILURES, {"reason": "tool_cancelled"}) or 0.0) == cancelled
        assert call.follow_ups() == 0

    run_virtual(main())


def test_closing_cancels_and_awaits_the_running_tools():
    async def main():
        call = ToolCall(hold_after_s=0.0)
        call.feed(call_events("r1", "c1", "wait_for_release", "{}"))
        await asyncio.sleep(0.1)
        assert call.hold.sounding
        await call.runner.close()
        assert call.runs.cancelled == ["wait_for_release"]
        assert not call.hold.sounding
        # The model (kept for a resume, maybe) learns what became of the call; nothing asks it to speak.
        assert call.error_of("c1")["code"] == "tool_cancelled"
        assert call.follow_ups() == 0

    run_virtual(main())
