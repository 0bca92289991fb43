"""A real aiortc caller talks to the embedded worker running the reference model."""

from __future__ import annotations

import numpy as np

from devtools.speech import speak, transcribe, words
from duplex_agent.agent.session.ledger import text_heard_by
from tests.integration.conftest import Microphone
from tests.support.waits import until
from tests.webrtc.client_peer import ClientPeer

QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")


#: Frames (20 ms) the caller keeps listening after the agent said its reply played out: the
#: last of it is still on its way (RTP, jitter buffer).
TAIL_FRAMES = 30


async def _until_played(peer: ClientPeer, since: int, timeout: float = 60) -> None:
    """Wait on the server's playout record: ``agent.state`` back at listening after speaking (the
    worker's playout queue ran dry with none of the reply still to come), then the tail frames."""

    def played_at() -> int | None:
        states = [(m["state"], i) for i, m in enumerate(peer.messages[since:]) if m.get("type") == "agent.state"]
        if states and states[-1][0] == "listening" and any(state == "speaking" for state, _ in states):
            return len(peer.received)
        return None

    await until(lambda: played_at() is not None, timeout, "the reply to play out")
    heard = len(peer.received)
    await until(lambda: len(peer.received) >= heard + TAIL_FRAMES, timeout, "the reply's last frames")


def _done(peer: ClientPeer, status: str) -> list[dict]:
    return [m for m in peer.messages if m.get("type") == "response.done" and m.get("status") == status]


async def test_caller_hears_a_spoken_reply(reference_worker):
    http, backend, _, address = reference_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")
        since = len(peer.messages)
        mic.say(speak(QUESTION, 48000, before_ms=300, after_ms=1500))
        await until(lambda: _done(peer, "completed"), 60, "the reply")
        await _until_played(peer, since)
        heard = np.concatenate(peer.received)
        said = words(transcribe(heard, 48000))
        assert "you" in said and "said" in said and "table" in said, said
        user = [m for m in peer.messages
                if m.get("type") == "conversation.item.input_audio_transcription.completed"]
        assert user and "table" in words(user[0]["transcript"])
    finally:
        await peer.close()
    await until(lambda: backend.active_sessions == 0, 10, "the worker to free the session")


async def test_talking_over_the_agent_stops_it_and_history_keeps_what_was_played(reference_worker):
    http, backend, plugin, address = reference_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        runner = backend.runners[0]
        mic.say(speak(LONG, 48000, before_ms=300, after_ms=1200))
        await until(lambda: peer.loud_frames() > 60, 40, "1.2 s of the agent's reply")
        interrupted_at = len(peer.received)
        mic.say(speak("Wait, stop please.", 48000, after_ms=100))
        # Cancelled while generating, or cut off while its last words were still playing.
        await until(lambda: _done(peer, "cancelled") or "output_audio_buffer.cleared" in peer.message_types(),
                       10, "the reply to be cut off")
        await until(lambda: not mic.busy, 10, "the interruption to be sent")
        # The agent went quiet: from 0.4 s after the interruption began until it ended, silence.
        quiet_from = interrupted_at + 20
        tail = peer.received[quiet_from:]
        assert tail and sum(float(np.sqrt(np.mean(f**2))) > 0.02 for f in tail) <= 2

        # The reply the caller talked over. On a busy machine a pause inside the long question can end
        # the turn early: that reply is cancelled by the rest of the question before any of it plays.
        item = next(i for i in runner.history if i.role == "assistant" and i.ledger and i.ledger.played_ms > 0)
        ledger = item.ledger
        assert ledger is not None and ledger.acked and 0 < ledger.played_ms < ledger.generated_ms
        assert item.heard_text == text_heard_by(ledger.marks, ledger.played_ms)
        kept, full = words(item.heard_text), words(ledger.full_text())
        assert kept and kept == full[: len(kept)] and len(kept) < len(full)
        # The model's own context gets the heard text at the next turn.
        await until(lambda: any(h["role"] == "assistant" and h["content"] == item.heard_text
                                   for h in plugin.context(runner.session_id).history),
                       30, "the next turn to commit the heard reply")
        context = [h["content"] for h in plugin.context(runner.session_id).history if h["role"] == "assistant"]
        assert item.heard_text in context and all(c in ("", item.heard_text) for c in context), context
    finally:
        await peer.close()
