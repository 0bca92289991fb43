"""A remote server that dies, drops, stalls, talks nonsense or refuses."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteConversation, RemoteOptions
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import AdmissionError
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from tests.support.audio import tone
from tests.support.ports import free_port

from .fake_server import (
    OMNI_CAPS,
    FakeSession,
    audio_delta,
    drop_connection,
    response_done,
    session_created,
)

ROOT = Path(__file__).resolve().parents[2]
NO_RESUME = {**OMNI_CAPS, "supports_session_resume": False}


async def next_event(conversation: RemoteConversation, timeout: float = 5.0) -> p.ServerEvent | None:
    return await asyncio.wait_for(anext(conversation.events(), None), timeout)


async def events_until(conversation: RemoteConversation, kind: str, timeout: float = 10.0) -> list[p.ServerEvent]:
    seen: list[p.ServerEvent] = []
    while (event := await next_event(conversation, timeout)) is not None:
        seen.append(event)
        if event.type == kind:
            return seen
    raise AssertionError(f"the conversation ended before {kind}: {[e.type for e in seen]}")


async def rest_of(conversation: RemoteConversation, timeout: float = 10.0) -> list[p.ServerEvent]:
    seen: list[p.ServerEvent] = []
    while (event := await next_event(conversation, timeout)) is not None:
        seen.append(event)
    return seen


@pytest.fixture
async def backends():
    made: list[RemoteBackend] = []

    def make(url: str, **kwargs) -> RemoteBackend:
        made.append(RemoteBackend(url, **kwargs))
        return made[-1]

    yield make
    for backend in made:
        await backend.close()


# ---- a real server process, killed and restarted ----


async def start_server_process(port: int = 0, resume_grace_s: float = 0.0) -> tuple[asyncio.subprocess.Process, int]:
    """A server process and the port it listens on: ``port``, or with 0 one the system picks as it
    binds (a port picked beforehand may be taken by another test's process before it binds)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.remote.server_process", str(port), str(resume_grace_s), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    ready, _, bound = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().partition(" ")
    assert ready == "ready", (ready, bound)
    return process, int(bound)


async def ask(conversation: RemoteConversation) -> None:
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    conversation.send(p.InputAudioBufferAppend(tone(300)))
    conversation.send(p.InputAudioBufferCommit())


async def test_server_killed_mid_reply_ends_cleanly_and_a_new_conversation_works_after_restart(backends):
    process, port = await start_server_process()
    try:
        backend = backends(f"ws://127.0.0.1:{port}/v1/realtime?duplex=1")
        await backend.start()
        assert not backend.capabilities.supports_resume
        conversation = await backend.open()
        await ask(conversation)
        await events_until(conversation, "response.output_audio.delta")
        process.send_signal(signal.SIGKILL)
        await process.wait()
        rest = await rest_of(conversation)
        assert [e.type for e in rest[-2:]] == ["error", "session.closed"]
        assert rest[-2].code == "backend_disconnected" and rest[-1].reason == "backend_disconnected"
        assert backend.active_sessions == 0
        assert await anext(conversation.events(), None) is None  # the end stays the end

        process, _ = await start_server_process(port)
        again = await backend.open()
        await ask(again)
        seen = await events_until(again, "response.done", timeout=20)
        assert seen[-1].status == "completed"
        assert sum(e.type == "response.output_audio.delta" for e in seen) == 60
        await again.close()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# ---- resume ----


def resumable_server(session: FakeSession, *, refuse_with: str | None = None):
    async def handler(ws: web.WebSocketResponse, request: web.Request) -> None:
        session.ws = ws
        first = await session.receive()
        assert first is not None
        if first["type"] == "session.update":
            await session.send(session_created(caps=OMNI_CAPS, token="tok-1"))
            await session.until("input_audio_buffer.commit")
            await session.send({"type": "response.created", "response_id": "r1", "response": {"id": "r1"}})
            await session.send(audio_delta("r1"))
            await session.send(audio_delta("r1"))
            session.stamp(audio_delta("r1"))  # journaled, never delivered: the connection drops first
            session.stamp(audio_delta("r1"))
            drop_connection(ws, request)
            return
        assert first["type"] == "session.resume"
        if refuse_with:
            await ws.send_str(json.dumps({"type": "error", "error": "Unknown or expired duplex session",
                                          "code": refuse_with}))
            return
        await ws.send_str(json.dumps({"type": "session.resumed", "session_id": "duplex-1", "resume_token": "tok-2",
                                      "attachment_generation": 2, "session": {"id": "duplex-1"}}))
        for event in [e for e in session.journal if e["server_event_seq"] > first["last_received_server_event_seq"]]:
            await ws.send_str(json.dumps(event))
        await session.until("input_audio_buffer.append")  # sent by the client while it was cut off
        await session.send(audio_delta("r1"))
        await session.send(response_done("r1"))
        await session.receive(timeout=10)

    return handler


async def test_a_dropped_connection_resumes_and_the_server_replays_what_was_missed(backends, fake_servers):
    session = FakeSession()
    server = await fake_servers(resumable_server(session))
    backend = backends(server.url, options=RemoteOptions(resume_backoff_s=0.05))
    conversation = await backend.open()
    assert conversation.capabilities.supports_resume
    conversation.send(p.InputAudioBufferCommit())
    seen = await events_until(conversation, "response.output_audio.delta")
    conversation.send(p.InputAudioBufferAppend(tone(100)))
    seen += await events_until(conversation, "response.done")

    resume = next(m for m in session.received if m["type"] == "session.resume")
    assert resume == {"type": "session.resume", "session_id": "duplex-1", "resume_token": "tok-1",
                      "last_received_server_event_seq": 5}  # created, heartbeat_ack, response.created, two deltas
    assert server.requests[1].query["autostart"] == "0"
    assert conversation.remote.resume_token == "tok-2" and conversation.resumes == 1
    deltas = [e for e in seen if isinstance(e, p.ResponseAudioDelta)]
    assert [d.audio_start_ms for d in deltas] == [0, 100, 200, 300, 400]  # each once, in order
    assert not [e for e in seen if isinstance(e, p.ErrorEvent)]
    assert seen[-1] == p.ResponseDone("r1", "completed")
    await conversation.close()


async def test_a_refused_resume_ends_the_conversation_with_backend_disconnected(backends, fake_servers):
    session = FakeSession()
    server = await fake_servers(resumable_server(session, refuse_with="session_resume_expired"))
    conversation = await backends(server.url, options=RemoteOptions(resume_backoff_s=0.05)).open()
    conversation.send(p.InputAudioBufferCommit())
    rest = await rest_of(conversation)
    assert [e.type for e in rest[-2:]] == ["error", "session.closed"] and rest[-2].code == "backend_disconnected"
    assert server.connections == 2  # a fatal refusal is not retried


# ---- a stalled server ----


async def test_a_stall_mid_reply_cancels_it_here_and_no_old_audio_bursts_out_after(backends, fake_servers):
    released = asyncio.Event()

    async def handler(ws, request):
        session = FakeSession()
        session.ws = ws
        await session.until("session.update")
        await session.send(session_created(caps=NO_RESUME, token=None))
        await session.until("input_audio_buffer.commit")
        await session.send({"type": "response.created", "response_id": "r1"})
        for _ in range(3):
            await session.send(audio_delta("r1"))
        handler.stall_began = time.monotonic()  # the last the client hears before the stall
        await released.wait()  # the stall: nothing for a while, then a burst of old audio
        for _ in range(10):
            await session.send(audio_delta("r1"))
        await session.send(response_done("r1"))
        await session.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0.0, "item_id": "u2"})
        while await session.receive(timeout=10) is not None:
            pass
        handler.received = session.received

    server = await fake_servers(handler)
    backend = backends(server.url, options=RemoteOptions(stall_timeout_s=0.4))
    conversation = await backend.open()
    seen: list[p.ServerEvent] = []  # everything but audio deltas, which go to the playout
    done_at: list[float] = []  # when each response.done reached this side

    def on_event(event: p.ServerEvent) -> None:
        if isinstance(event, p.ResponseDone):
            done_at.append(time.monotonic())
        seen.append(event)

    path = CallAudioPath(conversation, on_event=on_event)
    await path.start()
    try:
        conversation.send(p.InputAudioBufferCommit())
        deadline = time.monotonic() + 10.0
        while path.playout.queued_ms < 290:
            assert time.monotonic() < deadline, f"the reply's burst never queued: {path.playout.queued_ms} ms"
            await asyncio.sleep(0.01)
        assert path.next_frame().any()  # the reply plays
        stalled_at = time.monotonic()
        while not any(isinstance(e, p.ResponseDone) for e in seen):
            assert time.monotonic() - stalled_at < 30.0, "the stalled response was never cancelled"
            await asyncio.sleep(0.02)
        # Not at the first gap in the stream: only once the stall timeout (0.4 s) ran out after the
        # server's last send, which came before this side heard it. (How late after it depends on
        # the machine's load, so no upper bound is asserted.)
        assert done_at[0] - handler.stall_began >= 0.4, done_at[0] - handler.stall_began
        error, done = [e for e in seen if isinstance(e, p.ErrorEvent | p.ResponseDone)]
        assert error.code == "backend_stalled" and done == p.ResponseDone("r1", "cancelled", "backend_stalled")
        assert not path.next_frame().any() and path.playout.queued_ms == 0  # silence at once
    finally:
        released.set()
    deadline = time.monotonic() + 10.0
    while not any(isinstance(e, p.SpeechStarted) for e in seen):  # the session goes on
        assert time.monotonic() < deadline, "no speech_started after the stalled response"
        await asyncio.sleep(0.01)
    assert conversation.dropped_late_deltas == 10  # the burst of old audio never left the conversation
    assert sum(isinstance(e, p.ResponseDone) for e in seen) == 1
    assert not any(path.next_frame().any() for _ in range(20))
    await path.close()
    await conversation.close()
    deadline = time.monotonic() + 10.0
    # the fake server's handler records what it read once the socket ends
    while {"type": "response.cancel", "response_id": "r1"} not in getattr(handler, "received", []):
        assert time.monotonic() < deadline, f"no response.cancel reached the server: {getattr(handler, 'received', None)}"
        await asyncio.sleep(0.01)


async def test_a_server_that_stops_reading_gets_bounded_input_and_a_backpressure_error(backends, fake_servers):
    stop = asyncio.Event()

    async def handler(ws, request):
        session = FakeSession()
        session.ws = ws
        await session.until("session.update")
        await session.send(session_created(caps=NO_RESUME, token=None))
        await stop.wait()  # never reads again

    server = await fake_servers(handler)
    conversation = await backends(server.url, options=RemoteOptions(max_queued_input_ms=500)).open()
    seen: list[p.ServerEvent] = []
    reader = asyncio.create_task(_collect(conversation, seen))
    try:
        chunk = tone(100)
        peak = 0.0
        for _ in range(3000):  # 300 s of audio; the socket buffers fill after ~100 s of it
            conversation.send(p.InputAudioBufferAppend(chunk))
            peak = max(peak, conversation.queued_input_ms)
            await asyncio.sleep(0)  # the writer may send
        assert peak <= 500
        assert conversation.queued_input_ms == 500  # the writer is blocked: the queue is full, not growing
        await conversation.close()
        await reader
    finally:
        stop.set()
    errors = [e.code for e in seen if isinstance(e, p.ErrorEvent)]
    # Reported once per overflow, not once per dropped append (about 2000 here). While the socket's
    # buffers fill, the writer may empty the queue between two overflows, more often on a loaded
    # machine, so there may be a few; the queue's own test counts one per overflow exactly.
    assert errors and set(errors) == {"input_backpressure"} and len(errors) <= 5, errors


async def _collect(conversation: RemoteConversation, into: list[p.ServerEvent]) -> None:
    async for event in conversation.events():
        into.append(event)


# ---- nonsense from the server ----


async def test_malformed_and_unknown_events_are_skipped_and_the_session_goes_on(backends, fake_servers):
    got_commit = asyncio.Event()

    async def handler(ws, request):
        session = FakeSession()
        session.ws = ws
        await session.until("session.update")
        await session.send(session_created(caps=NO_RESUME, token=None))
        await ws.send_str("not json {")
        await ws.send_bytes(b"\x00\x01")
        await ws.send_str("[1, 2]")
        await session.send({"no": "type"})
        await session.send({"type": "response.brand_new_thing", "x": 1})
        await session.send({"type": "response.output_audio.delta", "response_id": 5})
        await session.send({"type": "response.created", "response_id": "r1"})
        await session.send(audio_delta("r1"))
        await session.send(response_done("r1"))
        await session.until("input_audio_buffer.commit")
        got_commit.set()
        await session.receive(timeout=10)

    server = await fake_servers(handler)
    conversation = await backends(server.url).open()
    seen = await events_until(conversation, "response.done")
    assert [e.type for e in seen] == ["response.created", "response.output_audio.delta", "response.done"]
    conversation.send(p.InputAudioBufferCommit())
    await asyncio.wait_for(got_commit.wait(), 5)
    await conversation.close()
    assert (await rest_of(conversation))[-1] == p.SessionClosed("client_closed")


# ---- refusals ----


async def test_a_full_server_refuses_with_resource_exhausted(backends):
    plugin = ScriptedPlugin(as_float32_audio, Script())
    local = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1)
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    try:
        backend = backends(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1), max_sessions=8)
        first = await backend.open()
        with pytest.raises(AdmissionError) as refused:
            await backend.open()
        assert refused.value.code == "resource_exhausted"
        assert "refused" in str(refused.value) and "1 sessions are in use" in str(refused.value)
        assert backend.active_sessions == 1
        await first.close()
    finally:
        await server.close()
        await local.close()


async def test_http_503_and_an_unreachable_server_are_admission_errors(backends):
    app = web.Application()
    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    app.router.add_get("/v1/realtime", busy)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        with pytest.raises(AdmissionError) as http_503:
            await backends(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)).open()
        assert http_503.value.code == "resource_exhausted" and "503" in str(http_503.value)
    finally:
        await server.close()
    with pytest.raises(AdmissionError) as unreachable:
        await backends(f"ws://127.0.0.1:{free_port()}/v1/realtime?duplex=1").open()
    assert unreachable.value.code == "backend_unavailable"


async def test_the_workers_own_limit_applies_before_the_server_is_asked(backends, fake_servers):
    async def handler(ws, request):
        session = FakeSession()
        session.ws = ws
        await session.until("session.update")
        await session.send(session_created(caps=NO_RESUME, token=None))
        await session.receive(timeout=10)

    server = await fake_servers(handler)
    backend = backends(server.url, max_sessions=1)
    first = await backend.open()
    with pytest.raises(AdmissionError) as full:
        await backend.open()
    assert full.value.code == "resource_exhausted" and server.connections == 1
    await first.close()
    assert backend.active_sessions == 0
