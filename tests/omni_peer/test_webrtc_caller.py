"""A direct WebRTC caller -> ``serve --backend`` -> the real vLLM-Omni 0.30.0.

The caller is an aiortc peer (``tests.webrtc.client_peer``) on this machine's interface (aiortc
skips loopback for ICE) that speaks Piper speech and hears the agent's Opus audio. Our server
relays the call to the peer, whose server VAD takes the turns and whose scripted stages say
``reply N`` as tones at ``reply_tone_hz(N)``; what the scripted engine cores did is read on the
peer's side from its engine record. Each test makes its own call on a stack: its serve started once per module, its peer shared
by the run (conftest).
"""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from devtools.speech import speak
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.integration.conftest import Microphone
from tests.omni_peer.caller import reply_tone_hz
from tests.omni_peer.processes import LONG_WORDS, SHORT_WORDS, OmniPeer
from tests.serve_process import ServeProcess
from tests.support.waits import until
from tests.webrtc.client_peer import ClientPeer

QUESTION = "Please book a table for two people tonight."
LONG = "Tell me a long story about the sea and the ships."
STOP = "Stop, tell me about the mountains instead."
#: The scripted model's word: 0.24 s of tone, then 0.06 s of silence ("reply N" itself is not spoken).
TONE_S = 0.24
FRAME_S = 0.02
LOUD_RMS = 0.02
#: Frames the caller keeps listening after the agent says it is done: the last ones are on their way.
TAIL_FRAMES = 30
CALL_TIMEOUT_S = 60.0


def frame_pitch_hz(frame: np.ndarray) -> float:
    """The strongest frequency of one 20 ms, 48 kHz frame (50 Hz bins: the replies are 150 Hz apart)."""
    spectrum = np.abs(np.fft.rfft(frame * np.hanning(len(frame))))
    return float(np.fft.rfftfreq(len(frame), 1 / 48000)[int(np.argmax(spectrum))])


def loud_frames_of_reply(frames: list[np.ndarray], index: int) -> list[int]:
    """Positions of the loud frames heard at reply ``index``'s pitch."""
    pitch = reply_tone_hz(index)
    return [n for n, frame in enumerate(frames)
            if float(np.sqrt(np.mean(frame ** 2))) > LOUD_RMS and abs(frame_pitch_hz(frame) - pitch) <= 50]


class Call:
    """One caller on a stack: its microphone, its peer connection, its HTTP session to our server."""

    def __init__(self, serve: ServeProcess) -> None:
        self.serve = serve
        self.mic = Microphone()
        self.peer = ClientPeer(interface_ipv4(), self.mic.next_frame)
        self.http = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{serve.port}")

    async def connect(self) -> None:
        await self.peer.connect(self.http)
        await until(lambda: self.peer.received, CALL_TIMEOUT_S, "the agent's track to flow")

    def done(self, since: int, *statuses: str) -> list[dict]:
        return [m for m in self.peer.messages[since:]
                if m.get("type") == "response.done" and m.get("status") in statuses]

    def played_out(self, since: int) -> bool:
        """The server's playout record: the agent spoke since ``since`` and is listening again."""
        states = [m["state"] for m in self.peer.messages[since:] if m.get("type") == "agent.state"]
        return "speaking" in states and states[-1] == "listening"

    async def close(self) -> None:
        await self.peer.close()
        await self.http.close()


@pytest.fixture
async def calls():
    made: list[Call] = []

    async def call(serve: ServeProcess) -> Call:
        made.append(Call(serve))
        await made[-1].connect()
        return made[-1]

    yield call
    for made_call in made:
        await made_call.close()


@pytest.fixture(scope="module")
def stacks(started, omni_peers):
    """rate -> (the peer speaking at that rate, our serve in front of it)."""
    made: dict[int, tuple[OmniPeer, ServeProcess]] = {}

    def stack(rate: int) -> tuple[OmniPeer, ServeProcess]:
        if rate not in made:
            peer = omni_peers(sample_rate=rate, words=LONG_WORDS if rate == 24000 else SHORT_WORDS)
            made[rate] = peer, started.serve(backend=peer.realtime_url)
        return made[rate]

    return stack


def thinker_turn(peer: OmniPeer, reply_prefix: str, *, after: int) -> dict:
    """The thinker's turn that says ``reply_prefix``, among the record's lines from ``after`` on (this call's)."""
    started = [line for line in peer.record()[after:] if line["stage"] == "thinker" and line["event"] == "started"
               and line["reply"].startswith(reply_prefix)]
    assert len(started) == 1, f"the peer's thinker started {reply_prefix!r} {len(started)} times: {peer.record()[after:]}"
    return started[0]


def code2wav_events(peer: OmniPeer, request_id: str) -> list[str]:
    return [line["event"] for line in peer.record() if line["stage"] == "code2wav" and line["request_id"] == request_id]


@pytest.mark.parametrize("rate", [16000, 24000])
async def test_a_spoken_question_gets_the_peers_reply_heard_by_the_caller(stacks, calls, rate):
    peer, serve = stacks(rate)
    words = LONG_WORDS if rate == 24000 else SHORT_WORDS
    call = await calls(serve)
    since, heard_from, recorded = len(call.peer.messages), len(call.peer.received), len(peer.record())
    call.mic.say(speak(QUESTION, 48000, before_ms=300, after_ms=1500))
    await until(lambda: call.done(since, "completed"), CALL_TIMEOUT_S, "the peer's reply to complete")
    await until(lambda: call.played_out(since), CALL_TIMEOUT_S, "the reply to play out")
    played = len(call.peer.received)
    await until(lambda: len(call.peer.received) >= played + TAIL_FRAMES, CALL_TIMEOUT_S, "the reply's last frames")

    transcripts = [m["transcript"] for m in call.peer.messages[since:]
                   if m.get("type") == "response.output_audio_transcript.done"]
    assert transcripts and transcripts[-1].startswith("reply 1 "), call.peer.message_types()[since:]
    # The caller heard the whole reply, at its pitch: every word's tone, through Opus at 48 kHz.
    heard = loud_frames_of_reply(call.peer.received[heard_from:], 1)
    assert abs(len(heard) * FRAME_S - words * TONE_S) <= 0.04 * words + 0.06, (len(heard), words)
    # On the peer's side: one thinker turn for it, its audio generated to the end.
    turn = thinker_turn(peer, transcripts[-1], after=recorded)
    assert code2wav_events(peer, turn["request_id"]) == ["started", "finished"]


async def test_talking_over_the_reply_stops_it_and_aborts_the_peers_generation(stacks, calls):
    peer, serve = stacks(24000)
    call = await calls(serve)
    since, heard_from, recorded = len(call.peer.messages), len(call.peer.received), len(peer.record())
    call.mic.say(speak(LONG, 48000, before_ms=300, after_ms=100))
    # 0.5 s of the reply heard, then the caller talks over it.
    await until(lambda: len(loud_frames_of_reply(call.peer.received[heard_from:], 1)) >= 25, CALL_TIMEOUT_S,
                   "0.5 s of the reply")
    call.mic.say(speak(STOP, 48000, after_ms=1500))
    await until(lambda: call.done(since, "cancelled", "incomplete")
                   or "output_audio_buffer.cleared" in call.peer.message_types()[since:],
                   CALL_TIMEOUT_S, "the reply to be cut off")
    cut_at = len(call.peer.received)
    await until(lambda: not call.mic.busy, CALL_TIMEOUT_S, "the interruption to be sent")
    # The interruption gets its own answer: reply 2 is heard.
    await until(lambda: len(loud_frames_of_reply(call.peer.received[cut_at:], 2)) >= 25, CALL_TIMEOUT_S,
                   "0.5 s of the answer to the interruption (reply 2)")

    first = loud_frames_of_reply(call.peer.received[heard_from:], 1)
    assert len(first) * FRAME_S < LONG_WORDS * TONE_S - 1.0, f"{len(first)} frames of the first reply heard"
    assert not [n for n in first if heard_from + n > cut_at + TAIL_FRAMES], "the first reply went on after the cut"
    # On the peer's side: the first reply's generation was aborted before its end.
    turn = thinker_turn(peer, "reply 1 ", after=recorded)
    await until(lambda: code2wav_events(peer, turn["request_id"])[-1:] == ["aborted"], CALL_TIMEOUT_S,
                   "the peer's code2wav to record the first reply's abort")
    assert "finished" not in code2wav_events(peer, turn["request_id"])
