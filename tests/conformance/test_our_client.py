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

    assert fake.errors == [], fake.errors
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
