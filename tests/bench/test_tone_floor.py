"""The barge-in floor (bench.echo_peer --reply tone) over real aiortc: it answers a caller's turn with a tone
after the caller's silence, and the caller's next sound cuts the tone short."""

from __future__ import annotations

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.echo_peer import ONSET_RMS, TONE_MS, build_app
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.integration.conftest import Microphone
from tests.support.audio import tone
from tests.support.waits import until
from tests.webrtc.client_peer import ClientPeer

pytestmark = pytest.mark.slow


def _loud(frame: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(frame**2))) > 0.02


@pytest.fixture
async def tone_floor():
    try:
        address = interface_ipv4()
    except ValueError:
        pytest.skip("no non-loopback IPv4 interface for ICE")
    client = TestClient(TestServer(build_app(address, reply="tone", end_silence_ms=300.0), host="127.0.0.1"))
    await client.start_server()
    yield client, address
    await client.close()


async def test_the_floor_answers_after_the_callers_silence_and_stops_at_their_next_sound(tone_floor):
    http, address = tone_floor
    mic = Microphone()
    caller = ClientPeer(address, mic.next_frame)
    try:
        await caller.connect(http)
        await until(lambda: len(caller.received) > 10, 20, "the floor's track")
        assert not any(_loud(f) for f in caller.received), "a tone before the caller said anything"
        mic.say(tone(400, hz=200.0, rate=48000))  # the caller's turn
        await until(lambda: any(_loud(f) for f in caller.received), 20, "the floor's tone reply")
        first_loud = next(i for i, f in enumerate(caller.received) if _loud(f))
        # Heard a little of the tone (well under its 1 s), the caller speaks again: the tone stops.
        await until(lambda: sum(_loud(f) for f in caller.received[first_loud:]) >= 10, 20, "200 ms of tone")
        mic.say(tone(400, hz=250.0, rate=48000))
        cut_at = len(caller.received)

        def quiet_for(frames: int) -> bool:
            tail = caller.received[cut_at:]
            return len(tail) > frames and not any(_loud(f) for f in tail[-frames:])

        await until(lambda: quiet_for(10), 20, "the tone cut by the caller's sound")
        heard = sum(_loud(f) for f in caller.received[first_loud:])
        assert heard * 20 < TONE_MS - 200, f"{heard * 20} ms of tone heard: it played out instead of stopping"
        # ... and after that turn's silence, the floor answers again.
        answered_at = len(caller.received)
        await until(lambda: any(_loud(f) for f in caller.received[answered_at:]), 20, "a second tone reply")
    finally:
        await caller.close()


def test_a_frame_holds_sound_when_any_5_ms_block_does():
    from bench.echo_peer import holds_sound

    frame = np.zeros(960, np.float32)
    assert not holds_sound(frame)
    frame[900:960] = 2 * ONSET_RMS  # the last 1.25 ms: its block's RMS is a quarter of that, under the line
    assert not holds_sound(frame)
    frame[720:960] = 2 * ONSET_RMS  # the whole last 5 ms block
    assert holds_sound(frame)
