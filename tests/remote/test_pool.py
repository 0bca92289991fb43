"""Several backends: placement by free sessions, cooldown, and a call that moves when its backend is lost.

The backends are our own endpoint with the scripted model, in this process (one piece at a time);
tests/remote/test_failover_processes.py runs the same with real ``duplex-agent serve`` processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_agent.agent import metrics
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.agent.remote.pool import BackendList, BackendPool
from duplex_agent.agent.session.cpu_guard import CpuGuard
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import AdmissionError
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.remote.conversation_events import events_until
from tests.support.audio import tone
from tests.support.cpu import ScriptedCpu
from tests.support.waits import until

OPTIONS = RemoteOptions(resume_backoff_s=0.05, resume_gives_up_unreachable=True)


class Served:
    """Our endpoint with the scripted model on a loopback port."""

    def __init__(self, max_sessions: int, reply: str, cpu_guard: CpuGuard | None = None) -> None:
        plugin = ScriptedPlugin(as_float32_audio, Script(reply=reply))
        self.backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=max_sessions)
        self.server = TestServer(build_app(self.backend, Settings(resume_grace_s=0), with_webrtc=False,
                                           cpu_guard=cpu_guard), host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)

    async def start(self) -> Served:
        await self.server.start_server()
        return self

    async def kill(self) -> None:
        await self.server.close()
        await self.backend.close()


@pytest.fixture
async def served():
    made: list[Served] = []

    async def make(max_sessions: int = 4, reply: str = "one two three four",
                   cpu_guard: CpuGuard | None = None) -> Served:
        made.append(await Served(max_sessions, reply, cpu_guard).start())
        return made[-1]

    yield make
    for server in made:
        await server.kill()


@pytest.fixture
async def pools():
    made: list[BackendPool] = []

    async def make(spec: str, *, lost_grace_s: float = 10.0, sizes: dict[str, int] | None = None,
                   connect_timeouts: dict[str, float] | None = None) -> BackendPool:
        def remote(url: str) -> RemoteBackend:
            timeout = (connect_timeouts or {}).get(url, OPTIONS.connect_timeout_s)
            return RemoteBackend(url, max_sessions=(sizes or {}).get(url, 4),
                                 options=dataclasses.replace(OPTIONS, connect_timeout_s=timeout))

        pool = BackendPool(BackendList(spec), remote, lost_grace_s=lost_grace_s)
        made.append(pool)
        await pool.start()
        return pool

    yield make
    for pool in made:
        await pool.close()


def ask(conversation) -> None:
    conversation.send(p.InputAudioBufferAppend(tone(300)))
    conversation.send(p.InputAudioBufferCommit())


def completed(event: p.ServerEvent) -> bool:
    return isinstance(event, p.ResponseDone) and event.status == "completed"


def test_the_backend_list_is_the_flag_the_environment_or_a_file(tmp_path):
    assert BackendList("ws://a/v1, ws://b/v1,ws://a/v1").urls() == ["ws://a/v1", "ws://b/v1"]
    listed = tmp_path / "backends"
    listed.write_text("# GPU hosts\nws://a/v1\n\nws://b/v1  # the spare\n")
    assert BackendList(f"@{listed}").urls() == ["ws://a/v1", "ws://b/v1"]


def test_repeated_backend_flags_join_like_the_environment():
    from duplex_agent.agent.app.cli import PluginOptions, build_parser

    settings = Settings(backend="ws://env/v1")
    parser = build_parser(settings, PluginOptions(settings))
    assert parser.parse_args(["serve"]).backend == "ws://env/v1"
    args = parser.parse_args(["serve", "--backend", "ws://a/v1", "--backend", "ws://b/v1"])
    assert BackendList(args.backend).urls() == ["ws://a/v1", "ws://b/v1"]


async def test_each_new_call_goes_to_the_backend_with_the_most_free_sessions(served, pools):
    small, large = await served(max_sessions=1), await served(max_sessions=3)
    pool = await pools(f"{small.url},{large.url}")
    members = {m.spec: m for m in pool.members}
    await until(lambda: all(m.backend.server_free_sessions is not None for m in members.values()), 15.0, "probes")
    first = await pool.open()
    assert first.backend_url == members[large.url].url  # 3 free beats 1
    await until(lambda: members[large.url].backend.server_free_sessions == 2, 15.0, "the large one's new figure")
    await until(lambda: pool.server_free_sessions == 3, 15.0, "the pool's figure")  # 1 + 2
    second = await pool.open()
    assert second.backend_url == members[large.url].url  # 2 free beats 1
    await until(lambda: members[large.url].backend.server_free_sessions == 1, 15.0, "the large one's figure")
    rtts = {url: members[url].rtt_s() for url in members}
    third = await pool.open()
    # 1 free each: the shorter round trip wins.
    assert third.backend_url == members[min(rtts, key=rtts.get)].url
    await until(lambda: pool.server_free_sessions == 1, 15.0, "the pool's last free session")
    fourth = await pool.open()
    assert fourth.backend_url != third.backend_url
    await until(lambda: pool.server_free_sessions == 0, 15.0, "a full pool")
    with pytest.raises(AdmissionError) as refused:
        await pool.open()
    assert refused.value.code == "resource_exhausted"
    text = metrics.render().decode()
    assert f'duplex_backend_sessions{{backend="{members[large.url].url}"}}' in text
    assert "duplex_backend_rtt_ms" in text and "duplex_backend_refusals_total" in text
    for conversation in (first, second, third, fourth):
        await conversation.close()


async def test_a_refusing_backend_is_cooled_down_and_the_call_goes_to_another(served, pools, caplog):
    caplog.set_level(logging.INFO, logger="duplex_agent.remote")
    async def full(request: web.Request) -> web.Response:
        return web.Response(status=503, text="all sessions are in use")

    app = web.Application()
    app.router.add_get("/v1/realtime", full)
    refusing = TestServer(app, host="127.0.0.1")
    await refusing.start_server()
    refusing_url = str(refusing.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)
    spare = await served()
    try:
        pool = await pools(f"{refusing_url},{spare.url}", sizes={refusing_url: 8})
        member = next(m for m in pool.members if m.spec == refusing_url)

        def cooldowns() -> list[tuple[float, int]]:
            """The pool's record of each cooldown it set on ``member``: (seconds, failures in a row)."""
            return [(r.args[1], r.args[3]) for r in caplog.records
                    if r.msg.startswith("backend %s cooled down") and r.args[0] == member.url]

        # Cooled down at its first refusal (the record, not the time left now, which a late
        # check on a loaded machine could find run out).
        assert cooldowns()[:1] == [(1.0, 1)]
        assert metrics.BACKEND_REFUSALS.labels(member.url)._value.get() >= 1
        conversation = await pool.open()
        assert conversation.backend_url != member.url
        await conversation.close()
        # Still refusing once cooled down: the next cooldown is longer. The pool's own record of each
        # cooldown it set, not the time left now (which shrinks with however late this poll wakes).
        await until(lambda: member.failures >= 2, 20, "a second try")
        assert cooldowns()[:2] == [(1.0, 1), (2.0, 2)], cooldowns()
    finally:
        await refusing.close()


async def test_a_host_whose_machine_is_saturated_is_passed_over_as_busy(served, pools):
    cpu = ScriptedCpu()
    guard = CpuGuard(0.9, cpu.meter())
    cpu.run(guard.meter, 6.0, 1.0)
    saturated = await served(cpu_guard=guard)
    spare = await served()
    pool = await pools(f"{saturated.url},{spare.url}", sizes={saturated.url: 8})  # the saturated host looks freer
    member, other = (next(m for m in pool.members if m.spec == url) for url in (saturated.url, spare.url))
    conversation = await pool.open()
    assert conversation.backend_url == other.url
    await conversation.close()
    assert metrics.BACKEND_REFUSALS.labels(member.url)._value.get() >= 1  # counted busy, not broken
    assert saturated.backend.active_sessions == 0


async def test_a_call_moves_to_another_backend_when_its_own_is_lost_and_keeps_its_history(served, pools):
    first, second = await served(reply="first answer"), await served(reply="second answer")
    pool = await pools(f"{first.url},{second.url}")
    conversation = await pool.open()
    seen: list[p.ServerEvent] = []
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    ask(conversation)
    answer = await events_until(conversation, completed, seen)
    heard_item = next(e.item_id for e in seen if isinstance(e, p.ResponseCreated))
    conversation.send(p.PlaybackAck(played_ms=10_000, response_id=answer.response_id))
    lost = first if conversation.backend_url.startswith(first.url.split("/v1")[0]) else second
    await lost.kill()
    # The caller asks again right away; the answer comes from the other backend.
    ask(conversation)
    again = await events_until(conversation, completed, seen)
    assert conversation.moves == 1 and again.response_id != answer.response_id
    assert not [e for e in seen if isinstance(e, p.ErrorEvent | p.SessionClosed)]
    # The conversation's history is there: the item of the first answer, by its id, on the new backend.
    conversation.send(p.ConversationItemRetrieve(heard_item))
    retrieved = await events_until(conversation, lambda e: isinstance(e, p.ConversationItemRetrieved), seen)
    expected = "first answer" if lost is first else "second answer"
    assert expected in str(retrieved.item)
    await conversation.close()


async def both_backends_lost(served, pools, lost_grace_s: float):
    """A call answered once on a pool of two backends, then both killed: the call, its events, its error."""
    only, other = await served(), await served()
    pool = await pools(f"{only.url},{other.url}", lost_grace_s=lost_grace_s)
    conversation = await pool.open()
    seen: list[p.ServerEvent] = []
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    ask(conversation)
    await events_until(conversation, completed, seen)
    await only.kill()
    await other.kill()
    error = await events_until(conversation, lambda e: isinstance(e, p.ErrorEvent), seen)
    return conversation, seen, error


async def test_with_no_backend_left_the_caller_is_told_and_the_call_ends_after_the_grace(served, pools):
    conversation, seen, error = await both_backends_lost(served, pools, lost_grace_s=1.0)
    assert error.code == "backend_unavailable"
    closed = await events_until(conversation, lambda e: isinstance(e, p.SessionClosed), seen)
    assert closed.reason == "backend_lost"


async def test_a_call_closed_while_it_looks_for_a_backend_ends_with_its_reason(served, pools):
    conversation, seen, error = await both_backends_lost(served, pools, lost_grace_s=60.0)
    assert error.code == "backend_unavailable"  # moving, and still looking
    await conversation.close("client_closed")
    closed = await events_until(conversation, lambda e: isinstance(e, p.SessionClosed), seen)
    assert closed.reason == "client_closed"


async def test_a_backend_that_takes_the_connection_and_never_answers_is_passed_over(served, pools, tmp_path):
    silent_sockets: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent_sockets.append(writer)

    hang = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    hang_url = f"ws://127.0.0.1:{hang.sockets[0].getsockname()[1]}/v1/realtime?duplex=1"
    good = await served()
    listed = tmp_path / "backends"
    listed.write_text(good.url + "\n")
    # The hung host is given up on after 1 s; a served one has the default to answer a loaded machine in.
    pool = await pools(f"@{listed}", sizes={hang_url: 8}, connect_timeouts={hang_url: 1.0})
    try:
        listed.write_text(f"{hang_url}\n{good.url}\n")  # a new host joins, and hangs
        await pool.reload()
        assert pool.urls[-1].startswith(hang_url.split("?")[0])
        conversation = await asyncio.wait_for(pool.open(), 15)
        hung = next(m for m in pool.members if m.spec == hang_url)
        assert conversation.backend_url != hung.url
        await until(lambda: hung.failures >= 1, 15.0, "the hung backend counted as failed")
        await conversation.close()
        # Removed from the file, it takes nothing more.
        listed.write_text(good.url + "\n")
        await pool.reload()
        assert pool.urls == [next(m for m in pool.members if m.spec == good.url).url]
    finally:
        hang.close()
        for writer in silent_sockets:
            writer.close()


async def test_closing_the_pool_ends_its_calls_with_shutdown_not_a_move(served, pools):
    await served()
    other = await served()
    pool = await pools(f"{(await served()).url},{other.url}")
    conversation = await pool.open()
    seen: list[p.ServerEvent] = []
    await pool.close()
    closed = await events_until(conversation, lambda e: isinstance(e, p.SessionClosed), seen)
    assert closed.reason == "shutdown" and conversation.moves == 0
    assert not [e for e in seen if isinstance(e, p.ErrorEvent)]


async def test_a_livekit_worker_on_a_pool_reports_the_pools_free_capacity(served, pools):
    from duplex_agent.agent.app.livekit_worker import worker_load

    one, two = await served(max_sessions=1), await served(max_sessions=1)
    pool = await pools(f"{one.url},{two.url}")
    await until(lambda: pool.server_free_sessions == 2, 15.0, "both backends' figures")
    assert worker_load(pool, [], 4) == 0.5  # 4 call slots here, 2 sessions left behind them
    calls = [await pool.open(), await pool.open()]
    await until(lambda: pool.server_free_sessions == 0, 15.0, "a full pool")
    assert worker_load(pool, calls, 4) == 1.0  # full: LiveKit sends this worker no more jobs
    for conversation in calls:
        await conversation.close()


async def test_vllm_omnis_health_is_read_when_there_is_no_healthz():
    """vLLM-Omni serves /health (200 healthy, 503 when its engine is dead) and no /healthz."""
    from yarl import URL

    from duplex_agent.agent.remote.capacity import ServerCapacity

    state = {"status": 200}

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy" if state["status"] == 200 else "unhealthy"},
                                 status=state["status"])

    app = web.Application()
    app.router.add_get("/health", health)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    capacity = ServerCapacity()
    probe = asyncio.create_task(capacity.probe(URL(str(server.make_url("/v1/realtime?duplex=1"))), {},
                                               interval_s=0.05))
    try:
        await until(lambda: capacity.rtt_s is not None, 15.0, "a probe through /health")
        assert capacity.alive and capacity.free_sessions is None  # alive, capacity unknown
        state["status"] = 503
        await until(lambda: not capacity.alive, 15.0, "the dead engine seen")
        assert capacity.free_sessions == 0
    finally:
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        await server.close()


def test_the_history_a_new_backend_gets_is_what_the_caller_heard():
    from duplex_agent.agent.remote.failover import HeardHistory

    history = HeardHistory()
    history.server_event(p.InputAudioBufferCommitted("item_u1"))
    history.server_event(p.ResponseCreated("resp_1", "item_a1"))
    history.server_event(p.InputTranscriptionCompleted("item_u1", " what is on tonight "))
    for n, word in enumerate(("a", "film", "at", "nine")):
        history.server_event(p.ResponseAudioDelta("resp_1", "item_a1", np.zeros(2400, np.float32), 24000,
                                                  100.0 * n, 100.0, [{"text": word, "start_ms": 100.0 * n,
                                                                      "end_ms": 100.0 * (n + 1)}]))
        history.server_event(p.ResponseTranscriptDelta("resp_1", "item_a1", word + " "))
    history.server_event(p.ResponseDone("resp_1", "completed"))
    history.client_event(p.PlaybackAck(played_ms=200.0, response_id="resp_1", truncate=True))  # cut off
    assert history.items() == [
        {"id": "item_u1", "type": "message", "role": "user", "content": [{"type": "input_text",
                                                                          "text": "what is on tonight"}]},
        {"id": "item_a1", "type": "message", "role": "assistant", "content": [{"type": "text",
                                                                               "text": "a film"}]},
    ]
    history.server_event(p.ConversationItemDeleted("item_u1"))
    assert [item["id"] for item in history.items()] == ["item_a1"]


def test_a_reply_cut_inside_a_text_mark_keeps_the_words_the_ledger_says_were_heard():
    """One mark can span several words (vLLM-Omni's span a chunk of text): a cut inside it keeps its heard share."""
    from duplex_agent.agent.remote.failover import HeardHistory
    from duplex_agent.agent.session.ledger import ResponseLedger, TextMark

    history = HeardHistory()
    ledger = ResponseLedger("resp_1", "item_a1")
    history.server_event(p.ResponseCreated("resp_1", "item_a1"))
    for n, text in enumerate(("a film at nine", " and one at ten")):
        mark = {"text": text, "start_ms": 400.0 * n, "end_ms": 400.0 * (n + 1)}
        history.server_event(p.ResponseAudioDelta("resp_1", "item_a1", np.zeros(9600, np.float32), 24000,
                                                  400.0 * n, 400.0, [mark]))
        ledger.record_audio(400.0, [TextMark(text, 0.0, 400.0)])
    history.server_event(p.ResponseDone("resp_1", "completed"))
    for played_ms, heard in ((250.0, "a film"), (700.0, "a film at nine and one at")):
        history.client_event(p.PlaybackAck(played_ms=played_ms, response_id="resp_1", truncate=True))
        ledger.acknowledge(played_ms)
        ledger.interrupt()
        assert ledger.heard_text() == heard
        assert history.items() == [{"id": "item_a1", "type": "message", "role": "assistant",
                                    "content": [{"type": "text", "text": heard}]}]


async def test_a_session_claimed_since_the_probe_last_asked_is_not_counted_free_twice():
    from yarl import URL

    from duplex_agent.agent.remote.capacity import ServerCapacity

    asks: asyncio.Queue[asyncio.Future] = asyncio.Queue()

    async def healthz(request: web.Request) -> web.Response:  # answered when the test says
        answer = asyncio.get_running_loop().create_future()
        asks.put_nowait(answer)
        return web.json_response({"sessions": await answer, "max_sessions": 4})

    async def next_ask() -> asyncio.Future:
        return await asyncio.wait_for(asks.get(), 15)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    capacity = ServerCapacity()
    for _ in range(1000):  # calls opened with no probe running (LiveKit's RemoteModelBackend starts none)
        capacity.claimed()
    assert capacity._claims == []  # nothing would ever drop them: none is kept
    probe = asyncio.create_task(capacity.probe(URL(str(server.make_url("/v1/realtime?duplex=1"))), {},
                                               interval_s=1.0))
    try:
        (await next_ask()).set_result(2)
        await until(lambda: capacity.free_sessions == 2, 15.0, "the first reading")
        asked = await next_ask()
        capacity.claimed()  # a call placed after the probe asked: its reading will not know it
        assert capacity.free_sessions == 1
        asked.set_result(3)  # one free on the server, by a reading asked before the claim: the claim still counts
        await until(lambda: capacity.free_sessions == 0, 15.0, "the reading that lacks the claim")
        (await next_ask()).set_result(3)  # the same figure, asked after the claim: the server has counted it
        await until(lambda: capacity.free_sessions == 1, 15.0, "the reading that has the claim")
    finally:
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        while not asks.empty():  # a request the probe left behind
            asks.get_nowait().set_result(0)
        await server.close()
