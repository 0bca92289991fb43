"""A reply that survives a socket whose network dropped with no reset, on our endpoint.

The client talks through a ``SilentPath``; mid-reply the path goes silent, so the server's side of
the old socket stays open and its sends back up in the kernel's buffers (the server's own send
buffer is small here, as a loaded host's would be, so that happens at once). The client resumes on
a new socket, as a client whose network came back does. vLLM-Omni answers ``session.resumed``,
replays, and the reply goes on to its ``response.done``; so must we, with every event once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from aiohttp import web

from duplex_agent.agent import metrics
from duplex_agent.agent.app.realtime_ws import RealtimeEndpoint
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.conformance.omni_client import OmniClient
from tests.silent_path import SilentPath
from tests.support.audio import tone

MANUAL = {"turn_detection": None}
#: A long story: 150 words of 100 ms, told ten times faster than it plays.
STORY = " ".join(f"w{i}" for i in range(150))
SEND_BUFFER_BYTES = 8192


@pytest.fixture
async def served():
    """served(socket_backlog_bytes=...) -> (direct URL, the path, a client factory, the endpoint, the backend)."""
    cleanups: list = []

    async def start(*, socket_backlog_bytes: int = 8 << 20):
        plugin = ScriptedPlugin(as_float32_audio, Script(reply=STORY, word_delay_s=0.01))
        backend = LocalBackend(plugin, plugin.build_local_engine())
        cleanups.append(backend.close)
        endpoint = RealtimeEndpoint(backend, resume_grace_s=30, socket_backlog_bytes=socket_backlog_bytes)
        app = web.Application()
        endpoint.register(app)
        runner = web.AppRunner(app)
        await runner.setup()
        cleanups.append(runner.cleanup)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)  # accepted sockets inherit it
        listener.bind(("127.0.0.1", 0))
        await web.SockSite(runner, listener).start()
        port = listener.getsockname()[1]
        path = await SilentPath(port).start()
        cleanups.append(path.close)

        def client(url: str) -> OmniClient:
            made = OmniClient(url)
            cleanups.append(made.close)
            return made

        return f"ws://127.0.0.1:{port}/v1/realtime?duplex=1", path, client, endpoint, backend

    yield start
    for cleanup in reversed(cleanups):
        with contextlib.suppress(Exception):  # teardown of sockets the test left half-open
            await cleanup()


async def mid_reply_then_silent(path: SilentPath, client) -> OmniClient:
    """A client on ``path`` that asked for the story, heard its start, and lost its network."""
    first = client(path.url("/v1/realtime?duplex=1"))
    await first.open(MANUAL)
    await first.append(tone(200))
    await first.send({"type": "input_audio_buffer.commit"})
    for _ in range(3):
        await first.until("response.output_audio.delta")
    assert path.go_silent(reset_clients=True) == 1  # the client knows; the server's side stays open, silent
    return first


async def resume_directly(url: str, client, first: OmniClient) -> tuple[OmniClient, dict]:
    second = client(url)
    second.last_seq = first.last_seq
    await second.connect("&autostart=0")
    await second.send({"type": "session.resume", "session_id": first.session_id, "resume_token": first.resume_token,
                       "last_received_server_event_seq": first.last_seq})
    return second, await second.recv(timeout=5)


def assert_heard_once_in_order(first: OmniClient, replayed: list[dict]) -> None:
    events = first.seen + replayed
    seqs = [e["server_event_seq"] for e in events if "server_event_seq" in e]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "an event lost or doubled across the sockets"
    spoken = "".join(e["delta"] + " " for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert spoken.split() == STORY.split()


async def test_a_reply_whose_network_dropped_silently_is_heard_to_its_end_after_a_resume(served):
    url, path, client, endpoint, backend = await served()
    first = await mid_reply_then_silent(path, client)
    # The model goes on telling: the session keeps every event for the resume, whatever the dead socket does.
    live = next(iter(endpoint.sessions._sessions.values()))
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while not any('"response.done"' in text for _, text in live.journal._entries):
        assert loop.time() < end and not live.closed.is_set(), "the story stopped while its socket was silent"
        await asyncio.sleep(0.02)
    second, resumed = await resume_directly(url, client, first)
    assert resumed["type"] == "session.resumed", resumed
    done, replayed = await second.until("response.done", timeout=20)
    assert done["response"]["status"] == "completed"
    assert_heard_once_in_order(first, replayed)
    # The call goes on, on the new socket.
    await second.append(tone(200))
    await second.send({"type": "input_audio_buffer.commit"})
    again, _ = await second.until("response.done", timeout=30)
    assert again["response"]["status"] == "completed"
    assert backend.active_sessions == 1


async def test_a_resume_mid_reply_is_answered_at_once_and_the_rest_of_the_reply_follows(served):
    """Resumed while the model is still telling, long after the dead socket's buffers filled: the
    answer comes at once, then the replay and the live rest, each event once."""
    url, path, client, endpoint, _ = await served()
    first = await mid_reply_then_silent(path, client)
    live = next(iter(endpoint.sessions._sessions.values()))
    silent_from = live.journal._bytes
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while live.journal._bytes < silent_from + (200 << 10):  # far past what the buffers on the way hold
        assert loop.time() < end, "the story stopped while its socket was silent"
        await asyncio.sleep(0.01)
    assert not any('"response.done"' in text for _, text in live.journal._entries), "the story is already over"
    second, resumed = await resume_directly(url, client, first)
    assert resumed["type"] == "session.resumed", resumed
    done, replayed = await second.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    assert_heard_once_in_order(first, replayed)


async def test_a_socket_that_takes_nothing_is_ended_and_the_session_waits_for_its_resume(served):
    """Past the backlog bound the silent socket counts as dropped: ended (it would be told why, if it
    read), counted, and the session kept for the grace; the resume replays the whole rest."""
    url, path, client, endpoint, backend = await served(socket_backlog_bytes=64 << 10)
    before = metrics.ERRORS.labels("client_too_slow")._value.get()
    first = await mid_reply_then_silent(path, client)
    live = next(iter(endpoint.sessions._sessions.values()))
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while live.ws is not None:  # the writer fell behind by more than 64 kB: the socket is let go
        assert loop.time() < end, "the silent socket was never let go"
        await asyncio.sleep(0.02)
    assert metrics.ERRORS.labels("client_too_slow")._value.get() == before + 1
    assert backend.active_sessions == 1 and not live.closed.is_set()
    second, resumed = await resume_directly(url, client, first)
    assert resumed["type"] == "session.resumed", resumed
    done, replayed = await second.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    assert_heard_once_in_order(first, replayed)
