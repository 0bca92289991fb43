"""Caller sound through Opus, as every WebRTC caller's arrives, into the call path with the real
Silero VAD, clock-free (one caller frame in, one agent frame out): a 48 ms grunt pauses the reply
and it resumes, at every alignment to the VAD's windows; held speech cancels it. Opus lets the
grunt ring on ~100 ms, 40-60 dB down, which Silero scores as speech: without the level rules
(``SPEECH_LEVEL_SPAN_DB``, ``SILENCE_DBFS``) the grunt cancelled the reply at 3-4 of these 16
alignments."""

import numpy as np
import pytest

from devtools.rtp_stream import through_opus
from devtools.speech import speak, vocal_burst
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol.events import PlaybackAck, ResponseCancel
from duplex_agent.webrtc.media.call_audio import CallAudioPath

from .fakes import FakeConversation
from .test_call_pause import reply

pytestmark = pytest.mark.asyncio

FRAME = 960  # 20 ms at 48 kHz
REPLY_MS = 3000.0
OFFSETS_MS = [2.0 * k for k in range(16)]  # against the 32 ms VAD window grid


def voice(make):
    try:
        return make()
    except Exception as exc:  # the voice is a wheel the machine may lack
        pytest.skip(f"Piper voice not available: {exc}")


async def call_with(sound: np.ndarray, offset_ms: float) -> tuple[FakeConversation, CallAudioPath]:
    """A reply playing, then 600 ms (plus ``offset_ms``) into it ``sound`` from the caller, through
    Opus; frames until the reply has played out or was cancelled."""
    conversation = FakeConversation()
    path = CallAudioPath(conversation, vad_model=SileroVadModel.shared())
    await path.start()
    await reply(conversation, path, REPLY_MS)
    lead = np.full(int(48 * (600.0 + offset_ms)), 1e-4, np.float32)
    caller = through_opus(np.concatenate([lead, sound, np.full(48000, 1e-4, np.float32)]))
    step = 0
    while path.playout.playing or path.playout.paused or step * FRAME < caller.size:
        frame = caller[step * FRAME : (step + 1) * FRAME]
        path.push_caller_frame(np.pad(frame, (0, FRAME - frame.size), constant_values=1e-4), 48000)
        path.next_frame()
        step += 1
        assert step < 1000, "the reply never ended"
    return conversation, path


@pytest.mark.parametrize("offset_ms", OFFSETS_MS)
async def test_a_grunt_through_opus_pauses_the_reply_and_it_resumes(offset_ms):
    conversation, path = await call_with(voice(lambda: vocal_burst(48.0)), offset_ms)
    try:
        assert not conversation.sent_of(ResponseCancel), f"a 48 ms grunt cancelled the reply (pauses {path.pauses})"
        assert path.pauses >= 1 and path.false_pauses == path.pauses
        assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(REPLY_MS)  # nothing skipped
    finally:
        await path.close()


@pytest.mark.parametrize("offset_ms", OFFSETS_MS[::4])
async def test_held_speech_through_opus_still_cancels_the_reply(offset_ms):
    conversation, path = await call_with(voice(lambda: speak("wait, stop", 48000)), offset_ms)
    try:
        assert conversation.sent_of(ResponseCancel) and path.barge_ins == 1
    finally:
        await path.close()


@pytest.mark.parametrize("text", ["Sorry, one thing.", "mm-hm", "Hold on."])
@pytest.mark.parametrize("offset_ms", OFFSETS_MS[::4])
async def test_speech_through_opus_is_paused_once_and_cancels_with_no_resume_between(text, offset_ms):
    """The level rule pauses on the onset's frame (where no window of that frame did); Silero scores
    the first windows of many words low (the "s" of "Sorry"), and the pause holds through them: no
    resume and pause again, a stutter (without the grace, 4 of these 12 did)."""
    conversation, path = await call_with(voice(lambda: speak(text, 48000)), offset_ms)
    try:
        assert path.pauses == 1 and path.false_pauses == 0
        assert conversation.sent_of(ResponseCancel) and path.barge_ins == 1
    finally:
        await path.close()
