"""The DuplexModel's pieces, one at a time: heard words, the gate, acks at the room's position,
the room's played stretches, the room output following our pause, the configuration calls, and the AgentSession settings it checks."""

from __future__ import annotations

import asyncio
import contextvars

import numpy as np
import pytest
from livekit import rtc
from livekit.agents import AgentSession, llm
from livekit.agents.job import JobExecutorType, _JobContextVar

from duplex_agent.agent.protocol.events import InputAudioBufferAppend, PlaybackAck, ResponseAudioDelta
from duplex_agent.agent.session.ledger import TextMark, text_heard_by
from duplex_agent.livekit_agents import DuplexModel
from duplex_agent.livekit_agents.agent_link import _aec_warmup_left_at_default
from duplex_agent.livekit_agents.backends import InProcessBackend
from duplex_agent.livekit_agents.gate import ResponseGate
from duplex_agent.livekit_agents.heard_words import HeardWords
from duplex_agent.livekit_agents.plugin_options import plugin_settings
from duplex_agent.livekit_agents.room_acks import RoomAckedConversation
from duplex_agent.livekit_agents.room_segment import RoomSegment
from duplex_agent.livekit_agents.session import (
    ROOM_DROP_FRAMES,
    ROOM_PAUSED_KEEPALIVE_S,
    DuplexAgentSession,
    SessionPlan,
)

MARKS = [{"text": "You said:", "start_ms": 0.0, "end_ms": 800.0},
         {"text": "Please book a table tonight.", "start_ms": 800.0, "end_ms": 2800.0}]


def test_heard_words_are_the_ledgers_words_one_by_one():
    heard = HeardWords()
    heard.add_marks("r1", MARKS)
    ledger = [TextMark(m["text"], m["start_ms"], m["end_ms"]) for m in MARKS]
    taken: list[str] = []
    for at in range(0, 3000, 20):
        taken += [w.text for w in heard.take_heard("r1", at)]
        assert " ".join(taken) == text_heard_by(ledger, at), at  # never ahead of the ledger, never behind
    assert taken == ["You", "said:", "Please", "book", "a", "table", "tonight."]


def test_heard_word_spans_sit_inside_their_marks_in_order():
    heard = HeardWords()
    heard.add_marks("r1", MARKS)
    words = heard.take_heard("r1", 2800.0)
    starts = [w.start_ms for w in words]
    assert starts == sorted(starts) and words[0].start_ms == 0.0 and words[2].start_ms >= 800.0
    assert all(w.end_ms <= 2800.0 for w in words)


def test_a_played_out_response_gives_its_last_words_too():
    heard = HeardWords()
    heard.add_marks("r1", MARKS)
    first = heard.take_heard("r1", 2700.0)  # resampling can leave the last samples a little short
    rest = heard.take_rest("r1")
    assert [w.text for w in first + rest][-1] == "tonight." and rest


def test_the_gate_is_open_exactly_while_a_response_is_named():
    gate = ResponseGate()
    frame = rtc.AudioFrame(bytes(1920), 48000, 1, 960)
    assert not gate.update(frame)
    gate.open_for = "r1"
    assert gate.update(frame)
    gate.deactivate()  # the adapter closing a burst does not reopen or close the next
    gate.open_for = None
    assert not gate.update(frame)


class _Recorder:
    """The inner conversation: what reaches the wire."""

    def __init__(self) -> None:
        self.sent: list = []
        self.capabilities = None
        self.session_id = "s1"

    def send(self, event) -> None:
        self.sent.append(event)


async def test_an_ack_waits_for_the_rooms_position_and_never_says_more_than_was_played():
    inner = _Recorder()
    conversation = RoomAckedConversation(inner, on_audio_delta=lambda e: None)
    conversation.send(PlaybackAck(played_ms=500.0, response_id="r0"))  # no room attached: straight through
    assert [e.played_ms for e in inner.sent] == [500.0]
    conversation.room_attached = True
    conversation.send(PlaybackAck(played_ms=1500.0, response_id="r1"))
    assert len(inner.sent) == 1  # held for the room's word
    conversation.room_played("r1", 1260.0)
    assert inner.sent[-1].response_id == "r1" and inner.sent[-1].played_ms == 1260.0
    conversation.room_played("r2", 3000.0)  # the room finished before our playout acked
    conversation.send(PlaybackAck(played_ms=2000.0, response_id="r2"))
    assert inner.sent[-1].played_ms == 2000.0


async def test_marks_are_seen_on_the_way_to_the_call_path():
    seen: list[str] = []

    class Inner(_Recorder):
        async def events(self):
            yield ResponseAudioDelta("r1", "i1", None, 24000, 0.0, 800.0, MARKS[:1])

    conversation = RoomAckedConversation(Inner(), on_audio_delta=lambda e: seen.append(e.response_id))
    assert [e.response_id async for e in conversation.events()] == ["r1"] and seen == ["r1"]


async def test_instructions_are_kept_for_the_opening_and_items_a_duplex_model_cannot_take_are_refused():
    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    assert model.capabilities.mutable_instructions and model.capabilities.mutable_tools
    session = model.session()
    try:
        await session._update_instructions("Be brief.")
        assert session._instructions == "Be brief."
        with pytest.raises(llm.RealtimeError, match="text messages and tool outputs only"):
            await session._append_items([llm.AgentHandoff(new_agent_id="other")])
        with pytest.raises(llm.RealtimeError, match="not opened yet"):
            await session._append_items([llm.ChatMessage(role="user", content=["hi"])])
    finally:
        await session.aclose()


async def test_in_process_outside_the_thread_executor_fails_clearly():
    model = DuplexModel.in_process("scripted")

    class Proc:
        executor_type = JobExecutorType.PROCESS

    class Ctx:
        proc = Proc()

    def in_a_process_job():
        _JobContextVar.set(Ctx())
        return model.session()

    with pytest.raises(llm.RealtimeError, match="thread executor"):
        contextvars.copy_context().run(in_a_process_job)


def test_unknown_plugin_options_are_a_type_error_naming_them():
    with pytest.raises(TypeError, match="bogus"):
        DuplexModel.in_process("reference", bogus=1)
    with pytest.raises(TypeError, match="moshi_cfg"):
        DuplexModel.in_process("moshi", moshi_cfg="tiny")


CLASHING_PLUGIN = '''
from dataclasses import dataclass

from duplex_agent.plugins.contract import option
from duplex_agent.plugins.scripted import ScriptedPlugin


@dataclass
class ClashingOptions:
    max_sessions: int = option(2, "an option named like one of the worker's settings")


class ClashingPlugin(ScriptedPlugin):
    options_type = ClashingOptions
'''


def test_a_plugin_option_named_like_a_worker_setting_is_refused_as_the_cli_refuses_it(tmp_path, monkeypatch):
    """Before, the plugin's option silently took max_sessions=3 and the worker's setting was out of reach."""
    (tmp_path / "clashing_lk.py").write_text(CLASHING_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(InProcessBackend, "preload", lambda self: None)
    with pytest.raises(ValueError, match="declares an option 'max_sessions' in ClashingOptions, but that is the "
                                         "worker setting max_sessions"):
        DuplexModel.in_process("clashing_lk.ClashingPlugin", max_sessions=3)


def test_in_process_options_configure_the_plugin_and_the_worker(monkeypatch):
    monkeypatch.setattr(InProcessBackend, "preload", lambda self: None)  # the settings, not a model load
    built = {}
    for plugin, options in (("moshi", {"moshi_config": "tiny", "device": "cpu", "max_sessions": 3}),
                            ("reference", {"responder": "echo"})):
        backend = DuplexModel.in_process(plugin, **options)._backend
        built[plugin] = plugin_settings(backend.plugin, backend.options)
    moshi, reference = built["moshi"], built["reference"]
    assert moshi.plugin_path.endswith("MoshiPlugin") and reference.plugin_path.endswith("ReferencePlugin")
    assert (moshi.plugin_options.moshi_config, moshi.plugin_options.device, moshi.max_sessions) == ("tiny", "cpu", 3)
    assert reference.plugin_options.responder == "echo"


async def test_the_aec_warmup_default_is_noticed_and_none_is_not():
    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    assert _aec_warmup_left_at_default(AgentSession(llm=model, vad=None))
    assert not _aec_warmup_left_at_default(AgentSession(llm=model, vad=None, aec_warmup_duration=None))
    assert not _aec_warmup_left_at_default(AgentSession(llm=model, vad=None, aec_warmup_duration=3.0))


async def test_listen_never_interrupts_the_agent_session():
    interrupts: list[str] = []
    for policy in ("barge_in", "listen"):
        model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1", session={"overlap_policy": policy})
        session = model.session()
        session._link.session = object()  # found
        session._link.interrupt = lambda policy=policy: interrupts.append(policy)
        session._frame_response = "r1"
        session._on_playout_cleared()
        assert "r1" in session._cut
        await session.aclose()
    assert interrupts == ["barge_in"]


async def test_an_unreachable_backend_is_an_error_event_with_its_code():
    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    session: DuplexAgentSession = model.session()
    errors: list[llm.RealtimeModelError] = []
    session.on("error", errors.append)
    await session._update_session(instructions="hi")
    await asyncio.wait_for(session._ready.wait(), 20)
    assert errors and errors[0].error.code == "backend_unavailable" and not errors[0].recoverable
    assert [f async for f in session.audio_stream] == []  # the stream ends: nothing to play
    await session.aclose()


async def test_caller_audio_while_the_session_opens_reaches_the_model_whole_and_in_order():
    # the in-process reference model: its load, then the call path's VAD load, come before the path runs
    sent_ms: list[float] = []

    class Recording:
        def __init__(self) -> None:
            self.backend = InProcessBackend("reference", {})

        async def open(self):
            conversation = await self.backend.open()
            send = conversation.send

            def recording_send(event) -> None:
                if isinstance(event, InputAudioBufferAppend):
                    sent_ms.append(1000.0 * len(event.audio) / event.sample_rate_hz)
                send(event)

            conversation.send = recording_send
            return conversation

    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    session = DuplexAgentSession(model, SessionPlan(Recording()), gate=ResponseGate())
    await session._update_session(instructions="hi")
    pushed_ms = 0.0
    ramp = np.arange(960, dtype=np.int16)
    # the caller talks on, at their pace, while the path starts: at most 5 s of it, well inside what
    # is kept (MAX_EARLY_INPUT_S), however long a loaded machine takes to open
    while not session._ready.is_set() and pushed_ms < 5000.0:
        session.push_audio(rtc.AudioFrame(ramp.tobytes(), 48000, 1, 960))
        pushed_ms += 20.0
        await asyncio.sleep(0.02)
    await asyncio.wait_for(session._ready.wait(), 120)
    assert session._path is not None and pushed_ms >= 20.0
    # and on through the running path: one that opened within the first frame may still hold all of it
    for _ in range(5):
        session.push_audio(rtc.AudioFrame(ramp.tobytes(), 48000, 1, 960))
        pushed_ms += 20.0
    # all of it reached the call path, not one 20 ms frame lost ...
    assert session._path._input_received_ms == pytest.approx(pushed_ms)
    # ... and went on to the model, less what the path holds: under one append (18.75 ms at the
    # model's 16 kHz) waiting to fill, and the resampler's few samples
    assert pushed_ms - 20.0 - 2.5 < sum(sent_ms) <= pushed_ms, (sum(sent_ms), pushed_ms)
    # what an app reads to know the caller's audio is coming in: all of it, kept or fed
    assert session.caller_audio_s == pytest.approx(pushed_ms / 1000.0)
    await session.aclose()


def _segment(frames: list[float]) -> RoomSegment:
    """A segment of 20 ms frames; ``frames`` is the response's audio each one carried (ms)."""
    segment, played = RoomSegment(), 0.0
    for carried in frames:
        played += carried
        segment.frame_handed(0.02, played)
    return segment


def test_the_rooms_stretches_map_onto_the_response_through_the_frames_handed_over():
    # 10 frames of audio, 5 of underrun silence (the gate stays open), 10 more of audio
    segment = _segment([20.0] * 10 + [0.0] * 5 + [20.0] * 10)
    segment.progressed(0.0, 0.2)
    segment.progressed(0.2, 0.16)  # a stretch through the underrun and 60 ms after it
    assert not segment.skipped
    assert segment.heard_ms(0.36) == pytest.approx(260.0)  # not 360: the silence carried none of it
    # a sink that reports no stretch: its position is all there is
    assert _segment([20.0] * 25).heard_ms(0.3) == pytest.approx(300.0)


def test_a_skipped_stretch_ends_what_was_heard_where_it_began():
    segment = _segment([20.0] * 30)
    segment.progressed(0.0, 0.25)  # played to 250 ms; then the paused output dropped its queue
    segment.progressed(0.37, 0.23)  # resumed past the 120 ms it dropped, and played out
    assert segment.skipped
    # the room's position says 480 ms played in all; the words heard without a gap end at 250 ms
    assert segment.heard_ms(0.48) == pytest.approx(250.0)


class _PausableOutput(rtc.EventEmitter):
    """AgentSession's audio output as our edge drives it: what it was told, in order."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls
        self.can_pause = True

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


async def test_our_pause_pauses_the_room_output_hands_it_what_drops_its_queue_then_little_until_the_resume():
    from types import SimpleNamespace

    from duplex_agent.webrtc.media.playout import PlayoutQueue

    calls: list[str] = []
    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    session: DuplexAgentSession = model.session()
    output = _PausableOutput(calls)
    session._link.session = SimpleNamespace(output=SimpleNamespace(audio=output))  # found
    playout = PlayoutQueue()
    playout.capture(np.full(48000, 0.1, np.float32), "r1")
    session._path = SimpleNamespace(playout=playout, next_frame=playout.next_frame)
    session._ready.set()
    frames = session.audio_stream

    async def next_frame() -> str:
        frame = await frames.__anext__()
        calls.append("frame")
        return frame

    for _ in range(3):
        await next_frame()
    assert playout.pause()
    session._follow_pause()  # as push_audio does once the edge judged the caller's frame
    assert calls[-1] == "pause"
    # the drop frames go at once: the fade-out and silence behind it
    started = asyncio.get_running_loop().time()
    for _ in range(ROOM_DROP_FRAMES):
        await next_frame()
    assert asyncio.get_running_loop().time() - started < 0.02
    # then, while paused, only a frame in ROOM_PAUSED_KEEPALIVE_S (they play after the resume,
    # and keep the adapter's burst open): the 20 ms clock's other frames are held back
    loop = asyncio.get_running_loop()
    handed = [loop.time()]
    for _ in range(2):
        await next_frame()
        handed.append(loop.time())
    assert min(b - a for a, b in zip(handed, handed[1:])) >= ROOM_PAUSED_KEEPALIVE_S - 0.005
    assert playout.resume()
    await next_frame()
    assert calls == ["frame"] * 3 + ["pause"] + ["frame"] * (ROOM_DROP_FRAMES + 2) + ["resume", "frame"]
    assert playout.played_ms("r1") == pytest.approx(3 * 20.0 + 5.0 + 20.0)  # the fade's 5 ms, nothing skipped
    session._path = None
    await session.aclose()


async def test_a_cut_leaves_the_paused_room_output_to_the_interrupt_and_a_refused_one_resumes_it():
    from types import SimpleNamespace

    from duplex_agent.webrtc.media.playout import PlayoutQueue

    for interrupt_taken, expected in ((True, ["pause"]), (False, ["pause", "resume"])):
        calls: list[str] = []
        model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
        session: DuplexAgentSession = model.session()
        session._link.session = SimpleNamespace(output=SimpleNamespace(audio=_PausableOutput(calls)))
        session._link.interrupt = lambda taken=interrupt_taken: taken
        playout = PlayoutQueue()
        playout.capture(np.full(4800, 0.1, np.float32), "r1")
        playout.next_frame()
        session._path = SimpleNamespace(playout=playout)
        session._frame_response = "r1"
        assert playout.pause()
        session._follow_pause()
        playout.clear()  # the barge-in confirmed: the call path clears, then says so
        session._on_playout_cleared()
        session._follow_pause()
        # resumed before the interrupt's clear_buffer lands, it would play the frame it holds
        assert calls == expected, interrupt_taken
        session._path = None
        await session.aclose()


async def test_a_reply_the_room_skipped_into_keeps_in_history_only_what_came_before_the_skip():
    from types import SimpleNamespace

    from livekit.agents.voice.io import PlaybackFinishedEvent, PlaybackProgressedEvent

    from duplex_agent.livekit_agents.agent_link import AgentSessionLink

    played: list[tuple[str, float, bool]] = []

    def on_room_played(response_id: str, played_ms: float, cut: bool, burst_from_ms: float) -> str | None:
        played.append((response_id, played_ms, cut))
        return "You said:" if cut else None

    link = AgentSessionLink(object(), response_of_burst=lambda: "r1", on_room_played=on_room_played)
    link._on_generation_created(llm.GenerationCreatedEvent(message_stream=None, function_stream=None,
                                                           user_initiated=False, response_id="m1"))
    for n in range(30):
        link.frame_handed("r1", 0.02, 20.0 * (n + 1))
    # a false pause: the paused output dropped 120 ms of its queue, resumed, and played out
    link._on_playback_progressed(PlaybackProgressedEvent(started_at=0.0, offset=0.0, duration=0.25))
    link._on_playback_progressed(PlaybackProgressedEvent(started_at=0.0, offset=0.37, duration=0.23))
    finished = PlaybackFinishedEvent(playback_position=0.48, interrupted=False)
    link._on_playback_finished(finished)
    assert played == [("r1", pytest.approx(250.0), True)]
    assert finished.synchronized_transcript == "You said:"
    # AgentSession took it as played out: the message is cut to the heard words as it is added
    message = llm.ChatMessage(id="m1", role="assistant", content=["You said: Please book a table tonight."])
    link._on_item_added(SimpleNamespace(item=message))
    assert message.text_content == "You said:"


async def test_a_reply_the_adapter_split_in_two_is_acked_once_at_its_end_and_each_message_keeps_its_own_words():
    """A frame 0.8 s late (a stalled loop) makes the adapter end its burst mid-reply: the rest of
    the response plays in a second burst, with a message of its own."""
    from types import SimpleNamespace

    from livekit.agents.voice.io import PlaybackFinishedEvent, PlaybackProgressedEvent

    for cut in (False, True):
        model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
        session: DuplexAgentSession = model.session()
        acks: list[tuple[str, float]] = []
        session._conversation = SimpleNamespace(room_played=lambda rid, ms: acks.append((rid, ms)))  # noqa: B023 (called within this iteration)
        session._words.add_marks("r1", MARKS)  # "You said:" 0-800 ms, "Please book a table tonight." -2800
        session._gate.open_for = "r1"
        link = session._link
        for message_id, frames in (("m1", range(12)), ("m2", range(12, 28))):  # r1's 0-1200 ms, then 1200-2800
            link._on_generation_created(llm.GenerationCreatedEvent(
                message_stream=None, function_stream=None, user_initiated=False, response_id=message_id))
            for n in frames:
                link.frame_handed("r1", 0.1, 100.0 * (n + 1))
        link._on_playback_progressed(PlaybackProgressedEvent(started_at=0.0, offset=0.0, duration=1.2))
        first = PlaybackFinishedEvent(playback_position=1.2, interrupted=False)
        link._on_playback_finished(first)
        assert acks == [] and first.synchronized_transcript is None  # the response goes on
        # the second burst: played out, or cut by the caller 0.6 s in (1800 ms of r1)
        end_s = 0.6 if cut else 1.6
        link._on_playback_progressed(PlaybackProgressedEvent(started_at=0.0, offset=0.0, duration=end_s))
        second = PlaybackFinishedEvent(playback_position=end_s, interrupted=cut)
        link._on_playback_finished(second)
        assert acks == [("r1", pytest.approx(1800.0 if cut else 2800.0))]  # once, where the caller stopped hearing it
        if cut:
            # the reply as acknowledged: everything heard from its start; the second message: its own words only
            assert session.cut_replies[-1].heard == text_heard_by([TextMark(**m) for m in MARKS], 1800.0)
            assert session.cut_replies[-1].heard.startswith("You said: Please")
            assert second.synchronized_transcript == session.cut_replies[-1].heard.removeprefix(
                text_heard_by([TextMark(**m) for m in MARKS], 1200.0)).strip()
            assert second.synchronized_transcript and "said" not in second.synchronized_transcript
        else:
            assert second.synchronized_transcript is None and not session.cut_replies
        session._conversation = None
        await session.aclose()


async def test_a_split_reply_whose_first_burst_was_cut_short_reports_once_and_its_later_burst_heard_nothing():
    from livekit.agents.voice.io import PlaybackFinishedEvent, PlaybackProgressedEvent

    from duplex_agent.livekit_agents.agent_link import AgentSessionLink

    played: list[tuple[str, float, bool, float]] = []

    def on_room_played(response_id: str, played_ms: float, cut: bool, burst_from_ms: float) -> str | None:
        played.append((response_id, played_ms, cut, burst_from_ms))
        return "You said:"

    link = AgentSessionLink(object(), response_of_burst=lambda: "r1", on_room_played=on_room_played)
    for message_id, frames in (("m1", range(10)), ("m2", range(10, 20))):
        link._on_generation_created(llm.GenerationCreatedEvent(
            message_stream=None, function_stream=None, user_initiated=False, response_id=message_id))
        for n in frames:
            link.frame_handed("r1", 0.1, 100.0 * (n + 1))
    link._on_playback_progressed(PlaybackProgressedEvent(started_at=0.0, offset=0.0, duration=0.3))
    link._on_playback_finished(PlaybackFinishedEvent(playback_position=0.5, interrupted=True))
    later = PlaybackFinishedEvent(playback_position=1.0, interrupted=False)
    link._on_playback_finished(later)
    assert played == [("r1", pytest.approx(300.0), True, 0.0)]  # once: the cut is the response's end
    assert later.synchronized_transcript == ""  # nothing of it counts as heard


async def test_a_knock_over_the_agent_does_not_pause_it_here_as_it_would_on_our_own_transports():
    """A false pause costs this path words (the room output's dropped queue is skipped, and history
    keeps only what came before): so a rise in the caller's level alone does not pause it."""
    from bench.false_pauses import knock as knock_of
    from duplex_agent.agent.models.vad import SileroVadModel
    from duplex_agent.webrtc.media.call_audio import CallAudioPath

    knock = np.concatenate([np.zeros(4800, np.float32), knock_of(40.0), np.zeros(9600, np.float32)])  # the VAD: not speech
    frames = [(np.clip(knock[i : i + 960], -1, 1) * 32767).astype(np.int16) for i in range(0, knock.size - 959, 960)]

    model = DuplexModel("ws://127.0.0.1:9/v1/realtime?duplex=1")
    session = DuplexAgentSession(model, SessionPlan(InProcessBackend("scripted", {})), gate=ResponseGate())
    await session._update_session(instructions="hi")
    await asyncio.wait_for(session._ready.wait(), 120)
    session._path.playout.capture(np.full(96000, 0.1, np.float32), "r1")  # the agent is speaking
    for frame in frames:
        session.push_audio(rtc.AudioFrame(frame.tobytes(), 48000, 1, 960))
    assert session._path.pauses == 0 and not session._path.playout.paused
    await session.aclose()

    # the same frames over a reply on the direct and LiveKit transports' path: paused by the level rule
    from tests.webrtc.fakes import CAPS, FakeConversation

    path = CallAudioPath(FakeConversation(CAPS), vad_model=SileroVadModel.shared())
    await path.start()
    path.playout.capture(np.full(96000, 0.1, np.float32), "r1")
    for frame in frames:
        path.push_caller_frame(frame.astype(np.float32) / 32768.0, 48000)
    assert path.level_pauses == 1
    await path.close()
