import asyncio
import time

import numpy as np
import pytest

from duplex_agent.agent.metrics import FIGURE_DEFINITIONS
from duplex_agent.agent.protocol.events import (
    InputAudioBufferAppend,
    PlaybackAck,
    ProtocolError,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    SessionUpdate,
    SpeechStopped,
)
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.playout import FRAME_MS

from .fakes import EnergyVadModel, FakeConversation

pytestmark = pytest.mark.asyncio

QUIET = np.zeros(960, dtype=np.float32)
LOUD = np.full(960, 0.3, dtype=np.float32) * np.sign(np.sin(np.arange(960) / 5)).astype(np.float32)


def delta(response_id: str, ms: float, rate: int = 24000, start_ms: float = 0.0) -> ResponseAudioDelta:
    samples = 0.2 * np.sin(np.arange(int(rate * ms / 1000)) / 7).astype(np.float32)
    return ResponseAudioDelta(
        response_id=response_id, item_id="i-" + response_id, audio=samples,
        sample_rate=rate, audio_start_ms=start_ms, audio_ms=ms,
    )


@pytest.fixture
async def call():
    conversation = FakeConversation()
    events, states = [], []
    path = CallAudioPath(
        conversation, vad_model=EnergyVadModel(),
        on_event=events.append, on_state=states.append,
    )
    await path.start()
    yield conversation, path, events, states
    await path.close()


async def test_start_configures_the_session(call):
    conversation, path, _, _ = call
    update = conversation.sent[0]
    assert isinstance(update, SessionUpdate)
    assert update.session["input_audio_format"] == "pcm_f32le"
    assert update.session["input_sample_rate"] == 16000
    assert update.session["turn_detection"]["type"] == "server_vad"
    assert update.session["overlap_policy"] == "barge_in"


async def test_caller_audio_is_resampled_and_appended(call):
    conversation, path, _, _ = call
    for _ in range(50):
        path.push_caller_frame(QUIET, 48000)
    appends = conversation.sent_of(InputAudioBufferAppend)
    total = sum(a.audio.size for a in appends)
    assert len(appends) >= 45
    assert abs(total - 16000) < 200  # 1 s at 16 kHz, less the resampler's held-back tail
    assert path.figures.last("input_added_ms") < 15  # resampler hold (~6 ms) plus work


async def test_barge_in_clears_then_cancels_then_acks_the_played_position(call):
    conversation, path, events, states = call
    order = []
    send = conversation.send

    def watching_send(event):
        if not isinstance(event, InputAudioBufferAppend):
            order.append((type(event).__name__, path.playout.queued_ms))
        send(event)

    conversation.send = watching_send
    conversation.emit(ResponseCreated(response_id="r1", item_id="i-r1"))
    conversation.emit(delta("r1", 1000))
    await conversation.handled()
    for _ in range(5):
        assert path.next_frame().any()
        path.push_caller_frame(QUIET, 48000)
    assert path.state == "speaking"
    order.clear()

    path.push_caller_frame(LOUD, 48000)
    path.push_caller_frame(LOUD, 48000)  # the first 32 ms window over the threshold: a pause, no verdict yet
    assert path.playout.paused and not order
    for _ in range(5):  # 7 frames hold the 4 windows of the minimum speech (100 ms)
        path.push_caller_frame(LOUD, 48000)
    assert [name for name, _ in order[:2]] == ["ResponseCancel", "PlaybackAck"]
    assert all(queued == 0 for _, queued in order[:2])  # the playout was already cleared
    cancel = conversation.sent_of(ResponseCancel)[0]
    assert (cancel.response_id, cancel.reason) == ("r1", "barge_in")
    ack = conversation.sent_of(PlaybackAck)[0]
    assert ack.response_id == "r1" and ack.played_ms == 5 * FRAME_MS
    assert not path.next_frame().any()
    barge_in_ms = path.figures.last("barge_in_ms")
    assert barge_in_ms is not None and barge_in_ms < 50
    assert path.state == "listening" and states[-1] == "listening"

    conversation.emit(delta("r1", 200, start_ms=1000))  # in flight before the cancel landed
    conversation.emit(ResponseDone(response_id="r1", status="cancelled", reason="barge_in"))
    await conversation.handled()
    assert not path.next_frame().any()
    assert len(conversation.sent_of(PlaybackAck)) == 1
    assert [e.type for e in events][-1] == "response.done"


async def test_listen_policy_keeps_playing_over_caller_speech(call):
    conversation, path, _, _ = call
    path.update_session({"overlap_policy": "listen"})
    assert conversation.sent[-1] == SessionUpdate(session={"overlap_policy": "listen"})
    conversation.emit(delta("r1", 500))
    await conversation.handled()
    for _ in range(5):
        path.next_frame()
        path.push_caller_frame(LOUD, 48000)
    assert path.next_frame().any()
    assert not conversation.sent_of(ResponseCancel)
    assert path.figures.last("barge_in_ms") is None


async def test_finished_response_is_acked_with_its_full_duration_and_turn_latency_measured(call):
    conversation, path, _, states = call
    for i in range(60):  # 1.2 s of caller audio; the frame of i=50 holds the 1000 ms position
        if i == 50:
            before_end = time.perf_counter()
        path.push_caller_frame(QUIET, 48000)
        if i == 50:
            after_end = time.perf_counter()
    conversation.emit(SpeechStopped(audio_end_ms=1000, item_id="u1"))
    await conversation.handled()
    assert path.state == "thinking"
    conversation.emit(delta("r1", 100))
    conversation.emit(ResponseAudioDone(response_id="r1", item_id="i-r1"))
    await conversation.handled()
    played_from = time.perf_counter()
    for _ in range(8):
        path.next_frame()
    acks = conversation.sent_of(PlaybackAck)
    assert len(acks) == 1 and acks[0].response_id == "r1"
    assert acks[0].played_ms == pytest.approx(100, abs=1)
    # Turn latency counts from when the end of the caller's speech reached the worker.
    assert 1000 * (played_from - after_end) <= path.figures.last("turn_ms") <= 1000 * (time.perf_counter() - before_end)
    assert path.figures.last("output_added_ms") is not None
    assert states == ["thinking", "speaking", "listening"]


async def test_runner_cancel_drops_queued_audio_and_acks(call):
    conversation, path, _, _ = call
    conversation.emit(delta("r1", 1000))
    await conversation.handled()
    path.next_frame()
    path.next_frame()
    conversation.emit(ResponseDone(response_id="r1", status="cancelled", reason="barge_in"))
    await conversation.handled()
    assert not path.next_frame().any()
    assert conversation.sent_of(PlaybackAck)[0].played_ms == 2 * FRAME_MS


async def test_page_session_settings_are_checked(call):
    _, path, _, _ = call
    with pytest.raises(ProtocolError) as bad_policy:
        path.update_session({"overlap_policy": "shout"})
    assert bad_policy.value.code == "invalid_field"
    with pytest.raises(ProtocolError) as unknown:
        path.update_session({"input_sample_rate": 8000})
    assert unknown.value.code == "unknown_session_field"
    with pytest.raises(ProtocolError):
        path.update_session(["not", "an", "object"])
    assert path.overlap_policy == "barge_in"


async def test_conversation_end_is_reported():
    conversation = FakeConversation()
    ended = asyncio.Event()
    path = CallAudioPath(conversation, vad_model=EnergyVadModel(), on_closed=ended.set)
    await path.start()
    await conversation.close()
    await asyncio.wait_for(ended.wait(), 1)
    await path.close()


async def test_the_page_gets_each_figures_definition(call):
    _, path, _, _ = call
    message = path.figures_message()
    assert message["definitions"] == FIGURE_DEFINITIONS
    assert set(message["latency"]) == set(FIGURE_DEFINITIONS)
