"""Our client (the remote backend under the transports' CallAudioPath) against a server that checks
what it receives the way vLLM-Omni does: a whole call gets no error from it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE
from tests.conformance.fake_omni import FakeOmni, turn_detection_problem
from tests.remote.conversation_events import events_until

REF_AUDIO = "data:audio/wav;base64,UklGRg=="
HUM = (0.05 * np.sin(2 * np.pi * 200 * np.arange(FRAME_SAMPLES) / SAMPLE_RATE)).astype(np.float32)


@pytest.fixture
async def fake():
    server = await FakeOmni().start()
    yield server
    await server.close()


class Call:
    """Caller frames in, playout frames out, as a transport runs them (faster than real time)."""

    def __init__(self, path: CallAudioPath, seen: list[p.ServerEvent]) -> None:
        self.path = path
        self.seen = seen

    async def run_until(self, done: Callable[[], bool], timeout: float = 15.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not done():
            assert loop.time() < end, f"timed out; seen {[e.type for e in self.seen][-12:]}"
            self.path.push_caller_frame(HUM, SAMPLE_RATE)
            self.path.next_frame()
            await asyncio.sleep(0.005)

    def count(self, kind: type[p.ServerEvent], **fields: object) -> int:
        return sum(isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items()) for e in self.seen)


async def test_a_whole_call_gets_no_error_from_a_vllm_omni_server(fake):
    options = RemoteOptions(resume_backoff_s=0.05, heartbeat_interval_s=0.2)
    backend = RemoteBackend(fake.url, model="openbmb/MiniCPM-o-4_5", session={"ref_audio": REF_AUDIO},
                            options=options)
    await backend.start()  # a probe session, opened and closed
    conversation = await backend.open()
    seen: list[p.ServerEvent] = []
    path = CallAudioPath(conversation, on_event=seen.append)
    await path.start()
    call = Call(path, seen)
    try:
        # 1. The caller talks; the model answers, and the answer plays out and is acknowledged.
        await call.run_until(lambda: call.count(p.ResponseDone, status="completed") == 1)
        # 2. The page's "listen" setting, and back.
        path.update_session({"overlap_policy": "listen"})
        path.update_session({"overlap_policy": "barge_in"})
        # 3. A telephone key press: answered here, never sent.
        conversation.send(p.InputDtmf(digit="5"))
        await call.run_until(lambda: call.count(p.DtmfReceived, digit="5") == 1)
        # 4. A barge-in while the next answer plays.
        await call.run_until(lambda: call.count(p.ResponseCreated) == 2 and path.playout.playing)
        speaking = [e for e in seen if isinstance(e, p.ResponseCreated)][-1].response_id
        conversation.send(p.BargeIn())
        await call.run_until(lambda: call.count(p.ResponseDone, response_id=speaking, status="cancelled") == 1)
        # 5. The connection drops; the client resumes and the call goes on.
        fake.drop()
        await call.run_until(lambda: conversation.resumes == 1 and call.count(p.ResponseDone, status="completed") == 2)
        # 6. The server's replay journal overflows: it says so, and the call goes on.
        await fake.overflow()
        await call.run_until(lambda: call.count(p.ResponseDone, status="completed") == 3)
    finally:
        await path.close()
        # 7. Hang up right after a last acknowledgement: close sends it before session.close.
        last = [e for e in seen if isinstance(e, p.ResponseCreated)][-1].response_id
        conversation.send(p.PlaybackAck(played_ms=40.0, response_id=last))
        await conversation.close()
    await backend.close()

    # the one error is the answer to the resume's probe, a retrieve of an item nobody has (by design:
    # it comes after everything the old socket delivered)
    probes = [e for e in fake.errors if e["error"]["code"] == "item_not_found"
              and str(e["error"]["event_id"]).startswith("evt_resume_probe")]
    assert len(probes) == fake.resumes and [e for e in fake.errors if e not in probes] == [], fake.errors
    kinds = [m["type"] for m in fake.received]
    assert "input_dtmf" not in kinds and "session.lagging" not in kinds
    assert kinds[-1] == "session.close" and fake.received[-2] == {  # the last ack is not dropped by close
        "type": "playback.ack", "response_id": last, "item_id": f"item_{last}", "played_ms": 40.0, "committed_ms": 40.0}
    assert "barge_in" in kinds and fake.resumes == 1 and fake.heartbeats >= 2
    assert all(turn_detection_problem(update) is None for update in fake.updates)
    policies = [u.get("overlap_policy") for u in fake.updates if "overlap_policy" in u]
    assert policies == ["barge_in_on_speech", "listen_only", "barge_in_on_speech"]
    assert not [e for e in seen if isinstance(e, p.ErrorEvent)]
    deltas = [e for e in seen if isinstance(e, p.ResponseAudioDelta)]
    starts = [(d.response_id, d.audio_start_ms) for d in deltas]
    assert len(starts) == len(set(starts))  # nothing replayed twice
    assert all(d.marks and d.marks[-1]["text"] for d in deltas)  # every chunk knows its words


def speech(ms: float, rate: int = 16000) -> np.ndarray:
    return (0.2 * np.sin(2 * np.pi * 220 * np.arange(int(rate * ms / 1000)) / rate)).astype(np.float32)


def completed(event: p.ServerEvent) -> bool:
    return isinstance(event, p.ResponseDone) and event.status == "completed"


async def open_on(fake: FakeOmni, **session) -> tuple[RemoteBackend, object]:
    backend = RemoteBackend(fake.url, session=session, options=RemoteOptions(resume_backoff_s=0.05))
    conversation = await backend.open()
    conversation.send(p.SessionUpdate({"input_sample_rate": 16000}))
    return backend, conversation


async def test_a_bare_commit_gets_a_reply_and_a_caller_that_never_acks_is_acknowledged_for():
    fake = await FakeOmni(reply_after_ms=1e9, reply_chunks=3).start()  # replies only when asked
    backend, conversation = await open_on(fake, playback_commit_policy="ack_only")
    seen: list[p.ServerEvent] = []
    try:
        conversation.send(p.InputAudioBufferAppend(speech(300)))
        conversation.send(p.InputAudioBufferCommit())  # as our transports send it: no response_create
        first = await events_until(conversation, completed, seen)
        # The transport never acknowledges; its next turn still gets a reply, not response_already_active.
        conversation.send(p.InputAudioBufferAppend(speech(300)))
        conversation.send(p.ResponseCreate())
        second = await events_until(conversation, completed, seen)
        assert second.response_id != first.response_id
    finally:
        await conversation.close()
        await backend.close()
        await fake.close()
    assert fake.errors == [] and not [e for e in seen if isinstance(e, p.ErrorEvent)]
    commit = next(m for m in fake.received if m["type"] == "input_audio_buffer.commit")
    assert commit["response_create"] is True
    kinds = [m["type"] for m in fake.received]
    ack = next(m for m in fake.received if m["type"] == "playback.ack")
    assert ack["response_id"] == first.response_id and kinds.index("playback.ack") < kinds.index("response.create")


async def test_a_finished_reply_is_acknowledged_once_it_has_played_out_so_new_speech_is_a_turn():
    fake = await FakeOmni(reply_after_ms=300, reply_chunks=3).start()  # model-native: speech starts replies
    backend, conversation = await open_on(fake, playback_commit_policy="ack_only")
    seen: list[p.ServerEvent] = []
    try:
        conversation.send(p.InputAudioBufferAppend(speech(400)))
        first = await events_until(conversation, completed, seen)
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        while not any(m["type"] == "playback.ack" for m in fake.received):  # its 300 ms have played out
            assert loop.time() < end, "no playback.ack sent for the transport"
            await asyncio.sleep(0.02)
        conversation.send(p.InputAudioBufferAppend(speech(400)))
        second = await events_until(conversation, completed, seen)
        assert second.response_id != first.response_id
    finally:
        await conversation.close()
        await backend.close()
        await fake.close()
    ack = next(m for m in fake.received if m["type"] == "playback.ack")
    assert ack["played_ms"] == ack["committed_ms"] == 300 and "truncate" not in ack
    assert fake.errors == []


async def test_a_text_only_reply_reaches_the_transport_as_its_transcript():
    fake = await FakeOmni(reply_after_ms=1e9, reply_chunks=4, text_only=True).start()
    backend, conversation = await open_on(fake)
    seen: list[p.ServerEvent] = []
    try:
        conversation.send(p.InputAudioBufferAppend(speech(300)))
        conversation.send(p.InputAudioBufferCommit())
        await events_until(conversation, completed, seen)
    finally:
        await conversation.close()
        await backend.close()
        await fake.close()
    deltas = "".join(e.delta for e in seen if isinstance(e, p.ResponseTranscriptDelta))
    [done] = [e for e in seen if isinstance(e, p.ResponseTranscriptDone)]
    assert deltas == done.transcript == "the quick brown fox"


async def test_under_commit_all_on_done_replies_are_acknowledged_for_the_transport_too():
    """The real vLLM-Omni 0.30.0 holds an unacknowledged reply under its default policy as well
    (tests/omni_peer: a caller that never acknowledges), so the backend acknowledges there too."""
    fake = await FakeOmni(reply_after_ms=1e9, reply_chunks=2).start()
    backend, conversation = await open_on(fake)  # vLLM-Omni's default policy, commit_all_on_done
    seen: list[p.ServerEvent] = []
    try:
        for _ in range(2):
            conversation.send(p.InputAudioBufferAppend(speech(300)))
            conversation.send(p.ResponseCreate())
            await events_until(conversation, completed, seen)
    finally:
        await conversation.close()
        await backend.close()
        await fake.close()
    assert fake.errors == []
    acks = [m for m in fake.received if m["type"] == "playback.ack"]
    assert acks and all(m["response_id"] and m["played_ms"] >= 0 for m in acks), acks
