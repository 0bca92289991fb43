"""Our remote backend against the real vLLM-Omni 0.30.0: caller -> ``serve --backend`` -> vLLM-Omni.

The caller is a realtime-websocket client on our server; between our server and the peer sits
a TCP relay a test can cut. Each test opens its own call on a stack: its serve started once per module, its peer shared by
the run (conftest).
The asserts are vLLM-Omni's behaviour as a caller of ours should see it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest

from devtools.speech import speak
from tests.conformance.omni_client import OmniClient
from tests.omni_peer.caller import REPLY_TIMEOUT_S, acknowledge, next_reply, reply_tone_hz, say
from tests.omni_peer.processes import LONG_WORDS, SHORT_WORDS, OmniPeer
from tests.serve_process import ServeProcess
from tests.support.audio import tone
from tests.support.waits import until
from tests.tcp_relay import RelayThread

#: Each scripted word is 0.3 s of audio; "reply N" itself is not spoken.
WORD_S = 0.3


@dataclass
class Stack:
    peer: OmniPeer
    relay: RelayThread
    serve: ServeProcess
    words: int


def _stack(started, omni_peers, **peer_options) -> Stack:
    peer = omni_peers(**peer_options)
    relay = RelayThread(peer.port).start()
    serve = started.serve(backend=f"ws://127.0.0.1:{relay.port}/v1/realtime?duplex=1")
    return Stack(peer, relay, serve, peer_options.get("words", 3))


@pytest.fixture(scope="module")
def stack24(started, omni_peers):
    stack = _stack(started, omni_peers, sample_rate=24000, words=LONG_WORDS)
    yield stack
    stack.relay.stop()


@pytest.fixture(scope="module")
def stack16(started, omni_peers):
    stack = _stack(started, omni_peers, sample_rate=16000, words=SHORT_WORDS)
    yield stack
    stack.relay.stop()


@pytest.fixture(scope="module")
def stack_text_model(started, omni_peers):
    stack = _stack(started, omni_peers, text_only=True, words=SHORT_WORDS)
    yield stack
    stack.relay.stop()


@pytest.fixture
async def call():
    clients: list[OmniClient] = []

    async def open_call(stack: Stack, **session) -> OmniClient:
        client = OmniClient(stack.serve.realtime_url)
        clients.append(client)
        await client.open({"turn_detection": None, **session})
        return client

    yield open_call
    for client in clients:
        # Only session.close ends a session at once: a bare socket close leaves it (and its vLLM-Omni
        # session) alive for the resume grace, and later tests on the module's peer would find it full.
        with contextlib.suppress(ConnectionError, TimeoutError, AssertionError):
            await client.send({"type": "session.close"})
            await client.until("session.closed")
        await client.close()


async def _ask(client: OmniClient, **commit) -> None:
    await say(client, tone(600))
    await client.send({"type": "input_audio_buffer.commit", **commit})


async def _until_done(client: OmniClient, reply, timeout: float = REPLY_TIMEOUT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while reply.status is None:
        assert loop.time() < deadline, f"no response.done within {timeout} s: {reply.names[-12:]}"
        reply.add(await client.recv(max(0.01, deadline - loop.time())))


def _check_full_reply(reply, index: int, words: int) -> None:
    assert reply.status == "completed", reply.names
    assert reply.transcript.startswith(f"reply {index} "), reply.transcript
    assert abs(reply.pitch_hz() - reply_tone_hz(index)) < 20, (reply.pitch_hz(), reply_tone_hz(index))
    assert abs(reply.seconds - words * WORD_S) < 0.2, reply.seconds


@pytest.mark.parametrize("rate", [24000, 16000])
async def test_reply_end_to_end(call, request, rate):
    stack = request.getfixturevalue("stack24" if rate == 24000 else "stack16")
    client = await call(stack)
    await _ask(client, response_create=True)
    _check_full_reply(await next_reply(client), 1, stack.words)


async def test_commit_without_server_vad_is_answered(call, stack16):
    """Our server answers a bare commit; through a vLLM-Omni backend (response_create defaults to false) too."""
    client = await call(stack16)
    await _ask(client)
    _check_full_reply(await next_reply(client), 1, stack16.words)


async def test_server_vad_commits_and_answers(call, stack16):
    client = await call(stack16, turn_detection={"type": "server_vad"})
    await say(client, speak("Please book a table for two people tonight.", before_ms=300, after_ms=1500),
              realtime=True)
    reply = await next_reply(client)
    _check_full_reply(reply, 1, stack16.words)
    assert "input_audio_buffer.speech_started" in [event["type"] for event in client.seen], client.seen[:20]


async def test_barge_in_stops_the_reply_and_the_next_one_answers(call, stack24):
    client = await call(stack24, turn_detection={"type": "server_vad"})
    await say(client, speak("Tell me a long story about the sea.", before_ms=300, after_ms=1500), realtime=True)
    first = await next_reply(client, stop_after="response.output_audio.delta")
    await say(client, speak("Stop, tell me about the mountains instead.", before_ms=100, after_ms=1500),
              realtime=True)
    await _until_done(client, first)
    assert first.status in ("cancelled", "incomplete"), first.names
    assert "input_audio_buffer.speech_started" in first.names, first.names
    # The reply stops where the caller's speech is found, however late a loaded machine finds it.
    assert first.seconds_after("input_audio_buffer.speech_started") == 0.0, first.names
    assert first.seconds < stack24.words * WORD_S - 0.2, first.seconds
    _check_full_reply(await next_reply(client), 2, stack24.words)


async def test_cancel_stops_the_reply_and_the_next_one_answers(call, stack24):
    client = await call(stack24)
    await _ask(client, response_create=True)
    first = await next_reply(client, stop_after="response.output_audio.delta")
    await client.send({"type": "response.cancel"})
    await _until_done(client, first)
    assert first.status == "cancelled", first.names
    assert first.seconds < stack24.words * WORD_S - 0.5, first.seconds
    await _ask(client, response_create=True)
    second = await next_reply(client)
    _check_full_reply(second, 2, stack24.words)
    assert first.response_id not in {event.get("response_id") for event in second.events}


async def test_caller_that_never_acknowledges_gets_every_reply(call, stack16):
    """vLLM-Omni holds a reply until playback is acknowledged; our backend must acknowledge for its caller."""
    client = await call(stack16)
    for index in (1, 2, 3):
        await _ask(client, response_create=True)
        _check_full_reply(await next_reply(client), index, stack16.words)


async def test_dropped_backend_socket_resumes_with_nothing_lost(call, stack16):
    """What our server wrote into the socket before it died (an ack, the next question) reaches vLLM-Omni
    after the resume: vLLM-Omni replays its own events only, so our client sends those again."""
    client = await call(stack16)
    await _ask(client, response_create=True)
    first = await next_reply(client)
    _check_full_reply(first, 1, stack16.words)
    connections = stack16.relay.connections
    # From here what our server writes towards vLLM-Omni is lost on the way, then the link is cut.
    stack16.relay.swallow_upstream()
    await acknowledge(client, first)  # a caller that acknowledges: only the resume is under test
    await _ask(client, response_create=True)
    await until(lambda: stack16.relay.swallowed > 20000, REPLY_TIMEOUT_S, "the question's audio to be written into the dying link")
    assert stack16.relay.cut() >= 1
    # "reply 2": the peer's session still holds turn 1, so this is the same session, resumed.
    _check_full_reply(await next_reply(client), 2, stack16.words)
    assert stack16.relay.connections > connections
    assert "again after the resume" in stack16.serve.log()


async def test_text_only_session_gets_a_text_reply(call, stack16):
    client = await call(stack16, modalities=["text"])
    await _ask(client, response_create=True)
    reply = await next_reply(client)
    assert reply.status == "completed", reply.names
    # vLLM-Omni's Qwen3-Omni sends the thinker text as the transcript even in a text-only response.
    assert (reply.text or reply.transcript).startswith("reply 1 "), reply.names
    assert not reply.chunks


async def test_text_only_model_reply_reaches_the_caller(call, stack_text_model):
    client = await call(stack_text_model)
    await _ask(client, response_create=True)
    reply = await next_reply(client)
    assert reply.status == "completed", reply.names
    assert (reply.text or reply.transcript).startswith("reply 1 "), reply.names
    assert not reply.chunks
