"""A speakerphone caller whose microphone carries the agent's own voice back (tests/support/echo.py):
the worker's echo canceller keeps the agent from interrupting itself, and a real barge-in still
stops it. In process, paced frame by frame, real Silero (tests/support/speakerphone.py)."""

import numpy as np
import pytest

from devtools.speech import speak
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.webrtc.media.barge_in import MAX_FALSE_PAUSES
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from tests.support.echo import EchoPath, room_response
from tests.support.speakerphone import ReplyingConversation, SpeakerphoneCall

pytestmark = pytest.mark.asyncio

REPLY = ("The trails in the mountains are open this weekend, and the weather looks dry and mild "
         "for a long walk with the dogs.")
INTERRUPTION = "Stop, please wait a moment. I have another question."


@pytest.fixture(scope="module")
def voices() -> tuple[np.ndarray, np.ndarray]:
    return speak(REPLY, 24000), 0.7 * speak(INTERRUPTION, 48000)


async def open_call(echo: EchoPath, *, cancel: bool) -> SpeakerphoneCall:
    conversation = ReplyingConversation()
    path = CallAudioPath(conversation, vad_model=SileroVadModel.shared(), echo_cancel=cancel)
    await path.start()
    return SpeakerphoneCall(path, conversation, echo)


async def test_without_the_canceller_the_agents_own_echo_cuts_its_reply(voices):
    reply, _ = voices
    call = await open_call(EchoPath(delay_ms=150, level_db=-10), cancel=False)
    heard = await call.reply(reply, 24000)
    await call.path.close()
    assert call.microphone.echo_energy > 0
    assert heard.cancelled, "the echo never reached the barge-in gate: the caller is not a speakerphone"


async def test_the_canceller_keeps_the_agent_from_interrupting_itself_and_barge_in_holds(voices):
    reply, interruption = voices
    call = await open_call(EchoPath(delay_ms=150, level_db=-10), cancel=True)
    replies = [await call.reply(reply, 24000) for _ in range(5)]
    cut_short = await call.reply(reply, 24000, interruption=interruption, interrupt_after_ms=1500)
    await call.path.close()
    # The canceller learns the room over the agent's first words; from then on its own voice never cuts it.
    assert not any(r.cancelled for r in replies[1:]), replies
    assert all(r.false_pauses <= MAX_FALSE_PAUSES for r in replies)
    assert cut_short.cancelled and cut_short.onset_to_quiet_ms is not None and cut_short.onset_to_quiet_ms <= 300
    assert cut_short.kept_db is not None and cut_short.kept_db > -6, "the canceller swallowed the caller's words"


@pytest.mark.parametrize("level_db, delay_ms, moving", [(-3, 150, False), (-10, 500, False), (-10, 80, True)],
                         ids=["echo louder than the voice", "echo half a second late", "echo path that moves"])
async def test_bad_echo_never_stops_the_agent_for_good(voices, level_db, delay_ms, moving):
    reply, interruption = voices
    echo = EchoPath(delay_ms=delay_ms, level_db=level_db)
    call = await open_call(echo, cancel=True)
    replies = []
    for index in range(4):
        if moving:
            echo.change(delay_ms=(80.0, 220.0, 140.0)[index % 3], level_db=(-10.0, -6.0, -14.0)[index % 3],
                        response=room_response(seed=index + 1))
        replies.append(await call.reply(reply, 24000))
    cut_short = await call.reply(reply, 24000, interruption=interruption, interrupt_after_ms=1500)
    await call.path.close()
    # Every reply is heard (a moved path may cut one while the canceller learns the new room, never
    # the agent for good), its pauses stay bounded, and the caller can still stop the agent.
    assert all(r.played_ms > 0 for r in replies), replies
    assert all(r.false_pauses <= MAX_FALSE_PAUSES for r in replies), replies
    if not moving:
        assert not any(r.cancelled for r in replies[1:]), replies
    assert cut_short.cancelled and cut_short.onset_to_quiet_ms is not None, cut_short
