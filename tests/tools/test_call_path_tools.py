"""Tools in the call path: declared in the session.update at start, their calls seen by the runner,
whether the words before a call were heard taken from the real playout, the hold sound played out
where the agent is silent."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from duplex_agent.agent.protocol.events import (
    OutputAudioBufferCleared,
    ResponseAudioDelta,
    ResponseCreated,
    ResponseDone,
    SessionUpdate,
    SpeechStopped,
)
from duplex_agent.agent.tools.call_info import CallInfo
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.toolbox import EdgeToolOptions, ToolBox
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.hold_sound import hold_pattern
from tests.support.waits import until
from tests.tools import toolkit
from tests.tools.harness import FakeControl, call_events
from tests.webrtc.fakes import CAPS, EnergyVadModel, FakeConversation

TOOL_CAPS = replace(CAPS, supports_tools=True)


def reply_audio(response_id: str, ms: float) -> ResponseAudioDelta:
    samples = 0.2 * np.sin(np.arange(int(24 * ms)) / 7).astype(np.float32)
    return ResponseAudioDelta(response_id, f"item-{response_id}", samples, 24000, 0.0, ms)


@pytest.fixture
async def tool_call():
    runs = toolkit.reset()
    box = ToolBox(load_tool_module("tests.tools.toolkit"), EdgeToolOptions(hold_after_s=0.0))
    conversation = FakeConversation(TOOL_CAPS)
    path = CallAudioPath(conversation, vad_model=EnergyVadModel(),
                         tools=box.for_call(CallInfo("peer", "alice", FakeControl())))
    await path.start()
    yield conversation, path, runs
    await path.close()


async def test_the_session_update_at_start_declares_the_tools_and_their_instructions(tool_call):
    conversation, path, _ = tool_call
    update = conversation.sent[0]
    assert isinstance(update, SessionUpdate)
    names = [tool["name"] for tool in update.session["tools"]]
    assert "get_weather" in names and "transfer" in names
    assert update.session["instructions"] == toolkit.instructions
    # The page's own instructions come first; the tools' stay.
    path.update_session({"instructions": "Be brief."})
    assert conversation.sent[-1].session["instructions"] == f"Be brief.\n\n{toolkit.instructions}"


async def test_a_model_that_cannot_call_tools_gets_none():
    conversation = FakeConversation(CAPS)
    box = ToolBox(load_tool_module("tests.tools.toolkit"))
    path = CallAudioPath(conversation, vad_model=EnergyVadModel(),
                         tools=box.for_call(CallInfo("peer", "alice", FakeControl())))
    await path.start()
    assert path.tools is None and "tools" not in conversation.sent[0].session
    await path.close()


async def test_an_after_heard_call_runs_once_the_playout_has_played_the_words_before_it(tool_call):
    conversation, path, runs = tool_call
    conversation.emit(SpeechStopped(1000.0))
    conversation.emit(ResponseCreated("r-say", "item-r-say"))
    conversation.emit(reply_audio("r-say", 200.0))
    conversation.emit(ResponseDone("r-say", "completed"))
    for event in call_events("r-call", "c1", "transfer", '{"to": "tel:+15550100"}'):
        conversation.emit(event)
    await conversation.handled()
    for _ in range(20):  # every task that can run now runs: the tool's waits
        await asyncio.sleep(0)
    assert runs.calls == []
    frames = 0
    while path.playout.playing or path.output.receiving:
        path.next_frame()
        frames += 1
    path.next_frame()
    assert frames >= 10  # 200 ms of the reply went out first
    await until(lambda: runs.names() == ["transfer"], 5, "the transfer to run")


async def test_an_after_heard_call_is_not_made_when_its_announcement_was_cut(tool_call):
    conversation, path, runs = tool_call
    conversation.emit(SpeechStopped(1000.0))
    conversation.emit(ResponseCreated("r-say", "item-r-say"))
    conversation.emit(reply_audio("r-say", 400.0))
    for event in call_events("r-call", "c1", "transfer", '{"to": "tel:+15550100"}'):
        conversation.emit(event)
    await conversation.handled()
    for _ in range(5):
        path.next_frame()
    conversation.emit(OutputAudioBufferCleared("r-say"))  # the reply is cut short
    await conversation.handled()
    await until(lambda: any(getattr(e, "item", {}).get("type") == "function_call_output" for e in conversation.sent),
                5, "the call's output")
    (output,) = [e.item for e in conversation.sent if getattr(e, "item", {}).get("type") == "function_call_output"]
    assert '"caller_interrupted"' in output["output"]
    assert runs.calls == []


async def test_the_hold_sound_plays_where_the_agent_is_silent_and_stops_at_the_answer(tool_call):
    conversation, path, runs = tool_call
    for event in call_events("r1", "c1", "wait_for_release", "{}"):
        conversation.emit(event)
    await conversation.handled()
    await until(lambda: path.hold_sounding, 5, "the hold sound")
    frames = np.concatenate([path.next_frame() for _ in range(100)])  # two seconds: one period
    assert np.array_equal(frames, hold_pattern()[:frames.size])
    runs.release.set()
    await until(lambda: len(conversation.sent) >= 3, 5, "the output and the follow-up")
    conversation.emit(ResponseCreated("r-answer", "item-r-answer"))
    conversation.emit(reply_audio("r-answer", 100.0))
    await conversation.handled()
    assert not path.hold_sounding
    answer = path.next_frame()
    assert np.abs(answer).max() > 0.1 * 32767  # the answer itself, not the quiet hold sound


def test_the_hold_sound_is_quiet_and_mostly_silence():
    pattern = hold_pattern().astype(np.float64) / 32767.0
    peak_dbfs = 20 * np.log10(np.abs(pattern).max())
    assert -25.0 < peak_dbfs < -23.0  # far below a voice near full scale
    assert np.mean(np.abs(pattern) > 1e-3) < 0.5  # notes, then quiet: no drone
