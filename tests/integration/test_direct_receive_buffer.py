"""A real aiortc caller whose microphone track loses packets talks to the embedded worker
(reference model): our receive buffer serves the call, recovers the lost frames from the
next packets' FEC, and the worker hears the question and replies as on a clean line."""

from __future__ import annotations

import av

from devtools.speech import speak, words
from duplex_agent.webrtc.direct.caller_receive import AdaptiveCallerAudioReader
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from duplex_agent.webrtc.direct.tracks import PlayoutTrack
from tests.integration.conftest import Microphone
from tests.integration.test_direct_webrtc import QUESTION, _done
from tests.support.waits import until
from tests.webrtc.client_peer import ClientPeer

#: Every this many packets one is never sent (its RTP time is skipped): 1 in 12, about 8 %.
LOSE_EVERY = 12


class LossyMicrophoneTrack(PlayoutTrack):
    """The caller's Opus track (in-band FEC on), with every ``LOSE_EVERY``-th packet lost on the way."""

    def __init__(self, next_frame) -> None:
        super().__init__(next_frame)
        self.sent = self.dropped = 0

    async def recv(self) -> av.Packet:
        packet = await super().recv()
        self.sent += 1
        if self.sent % LOSE_EVERY == 0:
            self.dropped += 1
            packet = await super().recv()  # the next 20 ms: a hole in the RTP timestamps, as a lost packet leaves
            self.sent += 1
        return packet


async def test_a_caller_losing_packets_is_heard_through_fec_and_gets_its_reply(reference_worker):
    http, backend, _, address = reference_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    track = LossyMicrophoneTrack(mic.next_frame)
    peer.pc.getSenders()[0].replaceTrack(track)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")
        reader = http.server.app[WEBRTC_PEERS].sessions[peer.pc_id].caller_reader
        assert isinstance(reader, AdaptiveCallerAudioReader)  # the default path serves the call
        mic.say(speak(QUESTION, 48000, before_ms=300, after_ms=1500))
        await until(lambda: _done(peer, "completed"), 90, "the reply")
        user = [m for m in peer.messages if m.get("type") == "conversation.item.input_audio_transcription.completed"]
        assert user and {"table", "two", "tonight"} <= set(words(user[0]["transcript"])), user
        reply = [m for m in peer.messages if m.get("type") == "response.output_audio_transcript.done"]
        assert reply and "table" in words(reply[-1]["transcript"])  # the reference model says back what it heard

        counts = reader.buffer.counts
        print("receive buffer:", counts, f"sender dropped {track.dropped}")
        assert track.dropped >= 10
        assert counts.lost >= track.dropped - 2  # each hole seen (the last ones may still be on their way)
        assert counts.recovered >= 3  # from the next packet's FEC (a lost silence packet has none)
        assert counts.samples_out == 960 * (counts.received + counts.recovered + counts.concealed)
    finally:
        await peer.close()
    await until(lambda: backend.active_sessions == 0, 10, "the worker to free the session")
