"""A host that stops answering without a TCP reset (a frozen VM, a partition, a power cut), and
hosts that answer badly: found within the bound, the call moved or ended alone, and a merely slow
host forgiven.

The frozen hosts are real server processes (our endpoint, the scripted model saying 60 words 50 ms
apart) stopped with SIGSTOP: the kernel keeps their sockets open and accepts new connections, and
nothing answers. The bad hosts are small servers that speak part of the protocol and stall.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time

import pytest
from aiohttp import web

from duplex_agent.agent import metrics
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.agent.remote.failover import FailoverConversation
from duplex_agent.agent.remote.pool import BackendList, BackendPool
from duplex_agent.agent.session.ports import AdmissionError
from tests.remote.conversation_events import events_until
from tests.remote.fake_server import OMNI_CAPS, FakeServer, FakeSession, session_created
from tests.remote.test_faults import start_server_process
from tests.support.audio import tone
from tests.support.waits import until

OPTIONS = RemoteOptions(connect_timeout_s=1.0, resume_backoff_s=0.05, resume_gives_up_unreachable=True)
#: For a host that never creates the session: given up sooner than a cold host's first session may take.
IMPATIENT = RemoteOptions(connect_timeout_s=1.0, open_timeout_s=1.0, resume_gives_up_unreachable=True)
#: The bound the issue sets: a frozen host is left, and the call starts moving, within this.
FAILOVER_BOUND_S = 2.0
NO_RESUME = {**OMNI_CAPS, "supports_session_resume": False}


def counted(counter, *labels: str) -> float:
    return counter.labels(*labels)._value.get()


def ask(conversation) -> None:
    conversation.send(p.InputAudioBufferAppend(tone(300)))
    conversation.send(p.InputAudioBufferCommit())


@pytest.fixture
async def hosts():
    """hosts(n) -> n server processes (resumable sessions) and their URLs; all stopped at teardown."""
    started: list[asyncio.subprocess.Process] = []

    async def start(n: int) -> tuple[list[asyncio.subprocess.Process], list[str]]:
        servers = await asyncio.gather(*(start_server_process(resume_grace_s=30) for _ in range(n)))
        processes = [process for process, _ in servers]
        started.extend(processes)
        return processes, [f"ws://127.0.0.1:{port}/v1/realtime?duplex=1" for _, port in servers]

    yield start
    for process in started:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            await process.wait()


@pytest.fixture
async def pools():
    made: list[BackendPool] = []

    async def make(urls: list[str], options: RemoteOptions = OPTIONS) -> BackendPool:
        pool = BackendPool(BackendList(",".join(urls)), lambda url: RemoteBackend(url, options=options))
        made.append(pool)
        await pool.start()
        return pool

    yield make
    for pool in made:
        await pool.close()


async def a_call_mid_reply(pool: BackendPool, seen: list[p.ServerEvent]) -> FailoverConversation:
    conversation = await pool.open()
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    ask(conversation)
    for _ in range(5):  # the reply is playing
        await events_until(conversation, lambda e: isinstance(e, p.ResponseAudioDelta), seen)
    return conversation


def holder(pool: BackendPool, processes, conversation: FailoverConversation) -> asyncio.subprocess.Process:
    return processes[[member.url for member in pool.members].index(conversation.backend_url)]


async def test_a_host_frozen_mid_reply_is_left_within_the_bound_and_the_next_question_is_answered(
        hosts, pools, caplog):
    caplog.set_level(logging.INFO, "duplex_agent.remote")
    processes, urls = await hosts(2)
    pool = await pools(urls)
    seen: list[p.ServerEvent] = []
    conversation = await a_call_mid_reply(pool, seen)
    frozen = holder(pool, processes, conversation)
    frozen_url = conversation.backend_url
    lost_before = counted(metrics.BACKEND_LOST, "unresponsive")
    frozen.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    ask(conversation)  # the caller asks again while the host is frozen
    cut = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), seen)
    moving_after = time.monotonic() - stopped_at
    assert cut.status == "failed" and cut.reason == "backend_lost"
    assert moving_after <= FAILOVER_BOUND_S, f"the call started moving {moving_after:.2f} s after the freeze"
    # The question asked into the frozen host is answered by the other one.
    answer = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), seen, timeout=30)
    assert answer.status == "completed"
    assert conversation.moves == 1 and conversation.backend_url != frozen_url
    assert not [e for e in seen if isinstance(e, p.ErrorEvent | p.SessionClosed)], seen
    # Why, in the log and /metrics: the host stopped answering (not a close), and no resume was tried on it.
    assert counted(metrics.BACKEND_LOST, "unresponsive") == lost_before + 1
    assert counted(metrics.BACKEND_FAILURES, frozen_url, "backend_lost_unresponsive") >= 1
    assert "answered nothing for" in caplog.text and "is gone (unresponsive)" in caplog.text
    assert "resume try" not in caplog.text
    await conversation.close()


async def test_a_host_that_pauses_half_a_second_mid_reply_keeps_its_call(hosts, pools):
    processes, urls = await hosts(2)
    pool = await pools(urls)
    seen: list[p.ServerEvent] = []
    conversation = await a_call_mid_reply(pool, seen)
    paused = holder(pool, processes, conversation)
    lost_before = counted(metrics.BACKEND_LOST, "unresponsive")
    paused.send_signal(signal.SIGSTOP)
    await asyncio.sleep(0.5)  # the pause itself (a garbage collection's length), not a wait for anything
    paused.send_signal(signal.SIGCONT)
    done = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), seen, timeout=30)
    assert done.status == "completed", seen[-3:]
    assert conversation.moves == 0
    assert counted(metrics.BACKEND_LOST, "unresponsive") == lost_before
    assert sum(isinstance(e, p.ResponseAudioDelta) for e in seen) == 60  # every word once, none lost
    await conversation.close()


async def test_a_lone_backend_that_freezes_is_tried_again_and_the_call_goes_on_when_it_wakes(hosts):
    """With nowhere else to go, a host that stopped answering may come back: the session is resumed."""
    processes, urls = await hosts(1)
    backend = RemoteBackend(urls[0], options=RemoteOptions(connect_timeout_s=0.5, resume_backoff_s=0.05))
    await backend.start()
    conversation = await backend.open()
    try:
        conversation.send(p.SessionUpdate({"turn_detection": None}))
        ask(conversation)
        seen: list[p.ServerEvent] = []
        first = await events_until(conversation, lambda e: isinstance(e, p.ResponseAudioDelta), seen)
        processes[0].send_signal(signal.SIGSTOP)
        # The stall watcher tells the transport first; the connection is given up a little later.
        await events_until(conversation, lambda e: isinstance(e, p.ErrorEvent) and e.code == "backend_stalled", seen)
        processes[0].send_signal(signal.SIGCONT)
        ask(conversation)
        done = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone) and e.status == "completed",
                                  seen, timeout=30)
        assert conversation.resumes == 1, "the session was not resumed on the host once it woke"
        assert not [e for e in seen if isinstance(e, p.SessionClosed)]
        assert done.response_id != first.response_id  # type: ignore[attr-defined]
    finally:
        await conversation.close()
        await backend.close()


async def test_a_stall_of_this_sides_own_loop_does_not_give_a_live_host_up(hosts):
    """The worker's own loop is busy for two seconds (the silence is its own): the host is asked
    before it is judged, and the call goes on on its socket."""
    _, urls = await hosts(1)
    backend = RemoteBackend(urls[0], options=OPTIONS)
    conversation = await backend.open()
    try:
        conversation.send(p.SessionUpdate({"turn_detection": None}))
        seen: list[p.ServerEvent] = []
        await events_until(conversation, lambda e: isinstance(e, p.SessionCreated), seen)
        lost_before = counted(metrics.BACKEND_LOST, "unresponsive")
        # A quiet moment with no ping out yet: nothing is in flight when the loop stops.
        liveness = conversation._connection.liveness  # noqa: SLF001  (the precondition, not the verdict)
        await until(lambda: 0.1 < liveness.silent_s < liveness.probe_after_s, 10.0, "a quiet socket")
        time.sleep(2.0)  # the stimulus: this loop runs nothing, as under a burst of work
        ask(conversation)
        done = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), seen, timeout=30)
        assert done.status == "completed"
        assert conversation.resumes == 0 and conversation.lost_reason is None
        assert counted(metrics.BACKEND_LOST, "unresponsive") == lost_before
    finally:
        await conversation.close()
        await backend.close()


# ---- hosts that answer badly ----


async def half_a_frame_then_nothing(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Opens the session, then starts a 256-byte text frame, sends 10 bytes of it, and stalls."""
    session = FakeSession()
    session.ws = ws
    await session.until("session.update")
    await session.send(session_created(caps=NO_RESUME, token=None))
    while (message := await session.receive(timeout=60)) is not None and message["type"] != "input_audio_buffer.commit":
        pass
    if message is None or request.transport is None:
        return  # a probe session, closed before it asked anything
    request.transport.write(b"\x81\x7e\x01\x00" + json.dumps({"type": "response.created"}).encode()[:10])
    await asyncio.Event().wait()  # never another byte; never reads again


async def never_creates_a_session(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Takes the websocket and the session.update, and answers nothing."""
    await ws.receive()
    await asyncio.Event().wait()


async def joined_first_in_line(bad: FakeServer, good_urls: list[str], tmp_path) -> BackendPool:
    """A pool started on ``good_urls``, then joined by ``bad``, which has the most room (a host not yet
    probed counts as wholly free): it is first in line for the next call."""
    listed = tmp_path / "backends"
    listed.write_text("".join(f"{url}\n" for url in good_urls))
    pool = BackendPool(BackendList(f"@{listed}"), lambda url: RemoteBackend(
        url, options=IMPATIENT if url == bad.url else OPTIONS, max_sessions=8 if url == bad.url else 4))
    await pool.start()
    listed.write_text("".join(f"{url}\n" for url in [bad.url, *good_urls]))
    await pool.reload()
    return pool


async def test_a_backend_that_sends_half_a_frame_and_stalls_loses_only_that_call(hosts, fake_servers, tmp_path,
                                                                                 caplog):
    caplog.set_level(logging.INFO, "duplex_agent.remote")
    bad = await fake_servers(half_a_frame_then_nothing)
    _, urls = await hosts(1)
    pool = await joined_first_in_line(bad, urls, tmp_path)
    try:
        await a_call_moved_off_half_a_frame(pool, bad, caplog)
    finally:
        await pool.close()


async def a_call_moved_off_half_a_frame(pool: BackendPool, bad: FakeServer, caplog) -> None:
    bad_url = next(m.url for m in pool.members if m.spec == bad.url)
    seen: list[p.ServerEvent] = []
    conversation = await pool.open()
    assert conversation.backend_url == bad_url
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    asked_at = time.monotonic()
    ask(conversation)
    answer = await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), seen, timeout=30)
    assert answer.status == "completed" and conversation.moves == 1
    assert time.monotonic() - asked_at < 10
    assert counted(metrics.BACKEND_FAILURES, bad_url, "backend_lost_unresponsive") >= 1
    assert "is gone (unresponsive)" in caplog.text
    # The pool goes on serving: another call is answered.
    other = await pool.open()
    other.send(p.SessionUpdate({"turn_detection": None}))
    ask(other)
    assert (await events_until(other, lambda e: isinstance(e, p.ResponseDone), [], timeout=30)).status == "completed"
    await other.close()
    await conversation.close()


async def test_a_lone_backend_that_sends_half_a_frame_ends_its_call_with_the_reason(fake_servers, caplog):
    caplog.set_level(logging.INFO, "duplex_agent.remote")
    bad = await fake_servers(half_a_frame_then_nothing)
    backend = RemoteBackend(bad.url, options=RemoteOptions(resume_backoff_s=0.05))
    try:
        conversation = await backend.open()
        ask(conversation)
        seen: list[p.ServerEvent] = []
        closed = await events_until(conversation, lambda e: isinstance(e, p.SessionClosed), seen)
        error = next(e for e in seen if isinstance(e, p.ErrorEvent))
        assert error.code == "backend_disconnected" and "stopped answering" in error.error["message"]
        assert closed.reason == "backend_disconnected"
        assert conversation.lost_reason == "unresponsive"
        assert "stopped answering" in caplog.text
        assert backend.active_sessions == 0
    finally:
        await backend.close()


async def test_a_backend_that_never_answers_the_session_handshake_is_passed_over(hosts, fake_servers, tmp_path):
    silent = await fake_servers(never_creates_a_session)
    _, urls = await hosts(1)
    pool = await joined_first_in_line(silent, urls, tmp_path)
    try:
        await answered_elsewhere(pool, silent)
    finally:
        await pool.close()
    # Alone, the same host refuses the call with the reason (the transport tells the caller).
    backend = RemoteBackend(silent.url, options=IMPATIENT)
    with pytest.raises(AdmissionError) as refused:
        await backend.open()
    assert refused.value.code == "backend_timeout"
    await backend.close()


async def answered_elsewhere(pool: BackendPool, silent: FakeServer) -> None:
    silent_url = next(m.url for m in pool.members if m.spec == silent.url)
    conversation = await asyncio.wait_for(pool.open(), 15)
    assert silent.connections >= 1, "the pool never tried the silent host"
    assert conversation.backend_url != silent_url
    assert counted(metrics.BACKEND_FAILURES, silent_url, "backend_timeout") >= 1
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    ask(conversation)
    assert (await events_until(conversation, lambda e: isinstance(e, p.ResponseDone), [], timeout=30)).status \
        == "completed"
    await conversation.close()


async def test_a_front_whose_lone_backend_never_creates_the_session_refuses_that_call_and_keeps_serving(
        fake_servers, caplog):
    """Through our endpoint: the caller is told why, the reason is in the log and /metrics, and the
    front answers the next caller (and its own routes) all the same."""
    from aiohttp.test_utils import TestServer

    from duplex_agent.agent.app.server import build_app
    from duplex_agent.agent.app.settings import Settings
    from tests.conformance.omni_client import OmniClient

    caplog.set_level(logging.INFO, "duplex_agent.realtime")
    silent = await fake_servers(never_creates_a_session)
    backend = RemoteBackend(silent.url, options=IMPATIENT)
    front = TestServer(build_app(backend, Settings(resume_grace_s=0), with_webrtc=False), host="127.0.0.1")
    await front.start_server()
    url = str(front.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)
    before = counted(metrics.ERRORS, "backend_timeout")
    try:
        for caller in range(2):
            client = OmniClient(url)
            try:
                await client.connect()
                await client.send({"type": "session.update", "event_id": f"evt_{caller}", "session": {}})
                refusal = await client.recv(timeout=10)
                assert refusal["type"] == "error" and refusal["error"]["code"] == "backend_timeout", refusal
                assert refusal["error"]["event_id"] == f"evt_{caller}"
            finally:
                await client.close()
        assert counted(metrics.ERRORS, "backend_timeout") == before + 2
        assert "refused: backend_timeout" in caplog.text
        assert silent.connections == 2 and backend.active_sessions == 0
    finally:
        await front.close()
        await backend.close()
