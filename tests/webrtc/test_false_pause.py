"""A short vocal burst (a cough-like grunt) over the agent, from a real aiortc caller with the real
Silero edge VAD: the reply pauses, resumes, and the caller hears all of it. Real speech over the
agent still cancels it (test_peer.py)."""

import contextlib

import numpy as np
import pytest

from devtools.speech import vocal_burst
from duplex_agent.agent.protocol.events import (
    PlaybackAck,
    ResponseCancel,
)
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import HumBackend
from .test_peer import serve

pytestmark = pytest.mark.asyncio

REPLY_S = 4


def burst_48ms() -> np.ndarray:
    """48 ms of Piper's "ah" at 48 kHz (``vocal_burst``): one or two Silero windows over the
    threshold, and the ring-down Opus adds well under the onset's level (test_opus_ring_down.py)."""
    try:
        return vocal_burst(48.0)
    except Exception as exc:  # the voice is a wheel the machine may lack
        pytest.skip(f"Piper voice not available: {exc}")


@contextlib.asynccontextmanager
async def reply_with(host_address, sound: np.ndarray):
    """A real aiortc caller that makes ``sound`` twice over a REPLY_S reply (two tries at a pause):
    (the conversation, the call path, the caller) once the reply has played out."""
    quiet = lambda s: np.full(int(48000 * s), 1e-4, dtype=np.float32)  # noqa: E731
    caller = np.concatenate([quiet(1.0), sound, quiet(1.0), sound, quiet(REPLY_S)])
    backend = HumBackend(REPLY_S, done=True)
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(caller))
    try:
        await client.connect(http)
        await until(lambda: backend.conversations and backend.conversations[0].sent_of(PlaybackAck), 30,
                       "the reply to play out")
        yield backend.conversations[0], app[WEBRTC_PEERS].sessions[client.pc_id].audio, client
    finally:
        await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        await http.close()


async def test_a_short_burst_over_the_agent_pauses_it_and_the_caller_hears_the_whole_reply(host_address):
    async with reply_with(host_address, burst_48ms()) as (conversation, path, client):
        ack = conversation.sent_of(PlaybackAck)[0]
        print(f"pauses {path.pauses}, false pauses {path.false_pauses}, "
              f"pause lengths {path.figures.recent('false_pause_ms')} ms")
        assert not conversation.sent_of(ResponseCancel)
        assert path.pauses >= 1 and path.false_pauses == path.pauses
        assert ack.response_id == "talk" and ack.played_ms == pytest.approx(1000.0 * REPLY_S)  # nothing skipped
        # The caller heard the reply: every 20 ms of it but the pauses' (each at most a few frames).
        reply_frames = 50 * REPLY_S
        await until(lambda: client.loud_frames() >= reply_frames - 5, 10, "the rest of the reply at the caller")
        levels = [float(np.sqrt(np.mean(f**2))) for f in client.received]
        loud = [i for i, level in enumerate(levels) if level > 0.02]
        gaps = [b - a - 1 for a, b in zip(loud, loud[1:]) if b - a > 1]
        assert gaps and max(gaps) <= 16  # the pause (at most 256 ms unconfirmed), heard as a gap


async def test_a_knock_over_the_agent_pauses_it_by_its_level_alone_and_the_caller_hears_the_whole_reply(host_address):
    """A knock Silero never scores as speech, from a real aiortc caller through Opus: only the level
    rule can pause the reply for it, and the reply resumes with nothing skipped."""
    from bench.false_pauses import knock

    async with reply_with(host_address, knock(40.0)) as (conversation, path, _):
        assert not conversation.sent_of(ResponseCancel)
        assert path.level_pauses >= 1 and path.false_pauses == path.pauses == path.level_pauses
        assert conversation.sent_of(PlaybackAck)[0].played_ms == pytest.approx(1000.0 * REPLY_S)
