"""A call that outlives its backend, with real parts: two ``duplex-agent serve`` backends (the scripted
model) and the real vLLM-Omni 0.30.0 (``devtools.omni_peer``) behind a front ``serve --backend A
--backend B [--backend PEER]``, and a realtime-websocket caller on the front."""

from __future__ import annotations

import asyncio

import pytest

from tests.conformance.omni_client import OmniClient
from tests.omni_peer.conftest import omni_python  # noqa: F401  (the fixture: .venv-omni, built or skipped)
from tests.omni_peer.processes import PEER_START_TIMEOUT_S, OmniPeer
from tests.serve_process import ServeProcess, free_port
from tests.support.audio import tone

MANUAL = {"turn_detection": None}
BACKEND_ARGS = ("--plugin", "scripted", "--drain-timeout", "2")


@pytest.fixture(scope="module")
def omni_peer(omni_python, tmp_path_factory):  # noqa: F811
    """The real vLLM-Omni peer, started once for the module (it takes a minute to import vLLM)."""
    peer = OmniPeer(free_port(), tmp_path_factory.mktemp("omni-peer") / "omni-peer.log")
    peer.start()
    try:
        peer.ready(PEER_START_TIMEOUT_S)
        yield peer
    finally:
        peer.stop()
        print(f"--- {peer.log_path.name} (tail) ---\n{peer.log()[-3000:]}")


@pytest.fixture
async def serves(tmp_path):
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        started.append(ServeProcess(tmp_path / f"serve{len(started)}.log", *args).start())
        return started[-1]

    yield start
    for serve in reversed(started):
        await serve.stop()
    for serve in started:
        print(f"--- {serve.log_path.name} (tail) ---\n{serve.log()[-3000:]}")


@pytest.fixture
async def clients():
    made: list[OmniClient] = []

    def make(url: str) -> OmniClient:
        made.append(OmniClient(url))
        return made[-1]

    yield make
    for client in made:
        # Only session.close ends a session at once: a bare socket close would leave it resumable,
        # holding the front (and the backend under it) in its drain at teardown.
        if client.ws is not None and not client.ws.closed:
            try:
                await client.send({"type": "session.close"})
                await client.until("session.closed")
            except (ConnectionError, TimeoutError):
                pass  # the test left it ended or unanswered: the front's drain timeout ends it
        await client.close()


async def ask(client: OmniClient) -> None:
    await client.append(tone(300))
    await client.send({"type": "input_audio_buffer.commit"})


async def answer_after(caller: OmniClient, earlier: str) -> tuple[dict, list[dict]]:
    """The next reply completed after ``earlier`` (whose own end may come first), and what came on the way."""
    seen: list[dict] = []
    while True:
        done, more = await caller.until("response.done", timeout=60)
        seen += more
        if done["response_id"] != earlier and done["response"]["status"] == "completed":
            return done, seen


async def in_use(*backends: ServeProcess) -> ServeProcess:
    """The backend holding the front's one session."""
    for _ in range(300):
        for backend in backends:
            if ((await backend.health()) or {}).get("sessions") == 1:
                return backend
        await asyncio.sleep(0.1)
    raise AssertionError("no backend holds the session")


async def front_of(serves, *backends: str, extra: tuple[str, ...] = ()) -> ServeProcess:
    args = [arg for url in backends for arg in ("--backend", url)]
    return await serves(*args, "--backend-connect-timeout", "1", "--backend-lost-grace", "5", "--drain-timeout", "2",
                        *extra).ready()


async def two_serves_listed(serves, tmp_path, listed: int = 2):
    """Two serve backends, and a backend file (a comment line on top) listing the first ``listed``."""
    a, b = serves(*BACKEND_ARGS), serves(*BACKEND_ARGS)
    await a.ready()
    await b.ready()
    path = tmp_path / "backends"
    path.write_text("# the GPU hosts\n" + "".join(f"{s.realtime_url}\n" for s in (a, b)[:listed]))
    return a, b, path


async def call_on_two_serves(serves, clients, tmp_path):
    """Two serve backends listed in a file (so a SIGHUP can add more), a front on it, a caller open."""
    a, b, listed = await two_serves_listed(serves, tmp_path)
    front = await front_of(serves, f"@{listed}")
    caller = clients(front.realtime_url)
    await caller.open(MANUAL)
    return a, b, listed, front, caller


async def peer_added(front: ServeProcess, listed, urls: list[str], peer: OmniPeer) -> None:
    """Add the peer to the front's backend file and SIGHUP it; wait until the front lists it.

    The front knows vLLM-Omni's free sessions only as its own room there (vLLM-Omni's /health
    publishes none), so before its first call the peer ties with a serve backend and the round
    trip decides: it joins once the call is on a serve backend."""
    import signal

    listed.write_text("".join(f"{url}\n" for url in [*urls, peer.realtime_url]))
    assert front.process is not None
    front.process.send_signal(signal.SIGHUP)
    label = f'duplex_backend_sessions{{backend="{peer.realtime_url.split("?")[0]}"}}'
    for _ in range(300):
        if label in await front.metrics():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the front never listed the peer:\n{await front.metrics()}")


def peer_turns(peer: OmniPeer, after: int) -> list[dict]:
    """The thinker turns the peer's scripted engine started, from its record's line ``after`` on."""
    return [line for line in peer.record()[after:] if line["stage"] == "thinker" and line["event"] == "started"]


def transcript(seen: list[dict]) -> str:
    return next(e["transcript"] for e in seen if e["type"] == "response.output_audio_transcript.done")


async def test_a_backend_killed_mid_reply_the_next_question_is_answered_by_another_with_the_history(
        serves, clients, omni_peer, tmp_path):
    """Two serve backends and the real vLLM-Omni: the call moves to the other serve or to vLLM-Omni
    (whichever the front ranks first), and the history is checked where it went."""
    a, b, listed, front, caller = await call_on_two_serves(serves, clients, tmp_path)
    await ask(caller)
    created, _ = await caller.until("response.created", timeout=30)
    done, seen = await caller.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    first_answer = transcript(seen)
    await caller.send({"type": "playback.ack", "response_id": done["response_id"], "played_ms": 10_000})
    used = await in_use(a, b)
    other = b if used is a else a
    await peer_added(front, listed, [a.realtime_url, b.realtime_url], omni_peer)
    recorded = len(omni_peer.record())
    # The next answer starts playing, and its host dies.
    await ask(caller)
    playing, _ = await caller.until("response.created", timeout=30)
    await caller.until("response.output_audio.delta", timeout=30)
    used.kill()
    await ask(caller)  # the caller asks again at once
    answered, seen = await answer_after(caller, playing["response_id"])
    assert not [e for e in seen if e["type"] in ("error", "session.closed")], seen
    assert "duplex_backend_failovers_total 1.0" in await front.metrics()
    # The history of the call is on the new backend: the first answer's item, as it was heard.
    if turns := peer_turns(omni_peer, recorded):
        assert len(turns) == 1 and transcript(seen) == turns[0]["reply"], (seen, turns)
        assert {"role": "assistant", "parts": [first_answer]} in turns[0]["conversation"], turns[0]["conversation"]
    else:
        assert ((await other.health()) or {}).get("sessions") == 1
        await caller.send({"type": "conversation.item.retrieve", "item_id": created["item_id"]})
        retrieved, _ = await caller.until("conversation.item.retrieved", timeout=30)
        assert "one two" in str(retrieved["item"]["content"])


async def test_a_call_whose_serve_backends_die_goes_on_on_vllm_omni_with_its_history(
        serves, clients, omni_peer, tmp_path):
    a, b, listed, front, caller = await call_on_two_serves(serves, clients, tmp_path)
    heard: list[str] = []
    recorded = None
    # Each answer from a serve backend is heard in full, then its host dies, until the call is on vLLM-Omni.
    while True:
        await ask(caller)
        done, seen = await caller.until("response.done", timeout=60)
        assert not [e for e in seen if e["type"] in ("error", "session.closed")], seen
        assert done["response"]["status"] == "completed", seen
        if recorded is not None and peer_turns(omni_peer, recorded):
            break
        assert len(heard) < 2, "both serve backends died and the call is still not on vLLM-Omni"
        heard.append(transcript(seen))
        await caller.send({"type": "playback.ack", "response_id": done["response_id"], "played_ms": 10_000})
        (await in_use(*[backend for backend in (a, b) if backend.process.poll() is None])).kill()
        if recorded is None:
            await peer_added(front, listed, [a.realtime_url, b.realtime_url], omni_peer)
            recorded = len(omni_peer.record())
    # On the peer's side: its thinker was prompted with the call so far, the history items first.
    answer = transcript(seen)
    turns = peer_turns(omni_peer, recorded)
    assert len(turns) == 1 and answer == turns[0]["reply"], (answer, turns)
    conversation = turns[0]["conversation"]
    assert [m["parts"] for m in conversation if m["role"] == "assistant"] == [[text] for text in heard], conversation
    assert [m["role"] for m in conversation] == ["user", "assistant"] * len(heard) + ["user"], conversation
    # The scripted thinker numbers its reply by the user turns it was given: this is the call's next one.
    assert answer.startswith(f"reply {len(heard) + 1} "), answer
    assert f"duplex_backend_failovers_total {float(len(heard))}" in await front.metrics()


async def test_a_backend_frozen_mid_reply_is_left_within_two_seconds_and_the_next_question_is_answered(
        serves, clients):
    """The operator's case: two backends behind a front, the one holding the call frozen (SIGSTOP: no
    reset, its sockets stay open) while it speaks, and the caller asks again at once."""
    import signal
    import time

    story = ("--plugin", "tests.remote.server_process.StoryPlugin", "--drain-timeout", "2")
    a, b = serves(*story), serves(*story)
    await a.ready()
    await b.ready()
    front = await front_of(serves, a.realtime_url, b.realtime_url)
    caller = clients(front.realtime_url)
    await caller.open(MANUAL)
    await ask(caller)
    playing, _ = await caller.until("response.created", timeout=30)
    await caller.until("response.output_audio.delta", timeout=30)
    frozen = await in_use(a, b)
    assert frozen.process is not None
    frozen.process.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        await ask(caller)
        cut, seen = await caller.until("response.done", timeout=30)
        moving_after = time.monotonic() - stopped_at
        assert cut["response_id"] == playing["response_id"] and cut["response"]["status"] == "failed", cut
        assert moving_after <= 2.0, f"the call started moving {moving_after:.2f} s after its host froze"
        answered, more = await answer_after(caller, playing["response_id"])
        seen += more
        assert not [e for e in seen if e["type"] in ("error", "session.closed")], seen
        metrics = await front.metrics()
        assert "duplex_backend_failovers_total 1.0" in metrics
        assert 'duplex_backend_connections_lost_total{reason="unresponsive"} 1.0' in metrics
        assert "stopped answering" in front.log()
    finally:
        frozen.process.send_signal(signal.SIGCONT)


class HostAddress:
    """A backend's address in front of its process: forwards TCP, until it ``hangs``: then every
    connection through it is dropped, and new ones are taken and never answered."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.hung = False
        self.accepted_while_hung = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> HostAddress:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1/realtime?duplex=1"

    def hang(self) -> None:
        self.hung = True
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.hung:
            self.accepted_while_hung += 1
            self._writers.append(writer)  # taken, never answered
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        assert self._server is not None
        self.hang()
        self._server.close()


async def test_a_host_that_takes_the_connection_and_never_answers_is_left_by_the_connect_timeout(serves, clients):
    a, b = serves(*BACKEND_ARGS), serves(*BACKEND_ARGS, "--max-sessions", "1")  # the call goes to a: more room
    await a.ready()
    await b.ready()
    host = await HostAddress(a.port).start()
    try:
        front = await front_of(serves, host.url, b.realtime_url)
        b_free = f'duplex_backend_free_sessions{{backend="{b.realtime_url.split("?")[0]}"}} 1.0'
        for _ in range(300):  # the front has read b's figure
            if b_free in await front.metrics():
                break
            await asyncio.sleep(0.1)
        assert b_free in await front.metrics(), "the front never read the spare backend's free session"
        caller = clients(front.realtime_url)
        await caller.open(MANUAL)
        await ask(caller)
        await caller.until("response.done", timeout=30)
        assert ((await a.health()) or {}).get("sessions") == 1
        host.hang()  # the call's connection drops; its host now takes connections and never answers
        await ask(caller)
        created, _ = await caller.until("response.created", timeout=60)
        answered, seen = await caller.until("response.done", timeout=60)
        assert answered["response_id"] == created["response_id"]
        assert answered["response"]["status"] == "completed", seen
        assert host.accepted_while_hung >= 1, "the front never tried the hung host"
        assert ((await b.health()) or {}).get("sessions") == 1
        assert not [e for e in seen if e["type"] in ("error", "session.closed")], seen
    finally:
        await host.close()


async def test_with_every_backend_full_a_new_call_is_refused_before_it_is_answered(serves, clients):
    a, b = serves(*BACKEND_ARGS, "--max-sessions", "1"), serves(*BACKEND_ARGS, "--max-sessions", "1")
    await a.ready()
    await b.ready()
    front = await front_of(serves, a.realtime_url, b.realtime_url)
    for _ in range(2):
        caller = clients(front.realtime_url)
        await caller.open(MANUAL)
    for backend in (a, b):
        assert ((await backend.health()) or {}).get("sessions") == 1
    late = await clients(front.realtime_url).connect()
    await late.send({"type": "session.update", "event_id": "evt_late", "session": MANUAL})
    refusal = await late.recv(timeout=30)
    assert refusal["type"] == "error" and refusal["error"]["code"] == "resource_exhausted"
    assert refusal["error"]["type"] == "rate_limit_error" and refusal["error"]["event_id"] == "evt_late"
    with pytest.raises(ConnectionError):
        await late.recv(timeout=10)


async def test_a_backend_file_is_re_read_on_sighup(serves, clients, tmp_path):
    import signal

    a, b, listed = await two_serves_listed(serves, tmp_path, listed=1)
    front = await front_of(serves, f"@{listed}")
    b_label = b.realtime_url.split("?")[0]
    assert b_label not in await front.metrics()
    listed.write_text(f"{a.realtime_url}\n{b.realtime_url}\n")
    assert front.process is not None
    front.process.send_signal(signal.SIGHUP)
    for _ in range(300):
        if f'duplex_backend_sessions{{backend="{b_label}"}}' in await front.metrics():
            break
        await asyncio.sleep(0.1)
    assert f'duplex_backend_sessions{{backend="{b_label}"}}' in await front.metrics()
    a.kill()  # the first host dies: calls now go to the one the file added
    caller = clients(front.realtime_url)
    await caller.open(MANUAL)
    await ask(caller)
    done, _ = await caller.until("response.done", timeout=60)
    assert done["response"]["status"] == "completed"
    assert ((await b.health()) or {}).get("sessions") == 1
