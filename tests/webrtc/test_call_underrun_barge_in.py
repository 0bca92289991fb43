"""Caller speech in a gap of the agent's reply (its playout ran dry waiting for the next audio, as a
frame-synchronous model late on a loaded CPU leaves it): still over the agent, still a barge-in
(fake conversation, energy VAD)."""

import pytest

from duplex_agent.agent.protocol.events import ResponseAudioDone, ResponseCancel, ResponseDone

from .test_call_audio import QUIET, delta
from .test_call_pause import CONTINUOUS_OVERLAP, SPEECH, open_call, paced, until_played

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("caps", [None, CONTINUOUS_OVERLAP], ids=["turn-based", "continuous-overlap"])
async def test_speech_that_starts_in_an_underrun_mid_reply_cuts_the_reply(caps):
    conversation, path = await open_call(**({"caps": caps} if caps else {}))
    conversation.emit(delta("r1", 200))  # more of r1 is to come
    await conversation.handled()
    paced(path, [QUIET] * 12)  # its 200 ms play (after the jitter hold), then the queue runs dry
    assert not path.playout.playing and path.playout.underruns > 0
    paced(path, SPEECH)
    cancel = conversation.sent_of(ResponseCancel)
    assert [(c.response_id, c.reason) for c in cancel] == [("r1", "barge_in")]
    assert path.barge_ins == 1
    await path.close()


async def test_speech_after_a_reply_played_out_is_the_callers_turn_not_a_barge_in():
    conversation, path = await open_call()
    conversation.emit(delta("r1", 200))
    conversation.emit(ResponseAudioDone(response_id="r1", item_id="i-r1"))
    conversation.emit(ResponseDone(response_id="r1", status="completed"))
    await conversation.handled()
    until_played(path)
    paced(path, [QUIET] * 3 + SPEECH)
    assert not conversation.sent_of(ResponseCancel) and path.barge_ins == 0
    await path.close()
