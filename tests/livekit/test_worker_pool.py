"""A LiveKit worker in front of a pool of backends (``start --backend A --backend B`` or ``@FILE``),
all real processes: placement by capacity, the load it reports when every backend is full, and
what a caller in the room gets when its call's only backend dies (the typed events on
``duplex.events``, then the call's end after ``--backend-lost-grace``), and what is left
when the worker itself dies."""

from __future__ import annotations

import asyncio
import json
import time

from devtools.speech import speak
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import AGENT_NAME
from tests.support.waits import until

#: Seconds a call with no backend left keeps looking for one (``--backend-lost-grace``).
LOST_GRACE_S = 4.0


class EventsListener:
    """What a caller's room receives on the worker's ``duplex.events`` topic: (arrival, decoded event)."""

    def __init__(self, caller: LiveKitCaller) -> None:
        self.events: list[tuple[float, dict]] = []
        self._tasks: set[asyncio.Task] = set()
        caller.room.register_text_stream_handler("duplex.events", self._on_stream)

    def _on_stream(self, reader, sender: str) -> None:
        async def read() -> None:
            self.events.append((time.monotonic(), json.loads(await reader.read_all())))

        task = asyncio.create_task(read())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def first(self, kind: str) -> tuple[float, dict] | None:
        return next(((at, event) for at, event in self.events if event["type"] == kind), None)


async def _caller(livekit_server, identity: str, room: str) -> LiveKitCaller:
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token(identity, room))
    await caller.join()
    return caller


async def test_a_call_whose_only_backend_dies_gets_a_typed_error_then_ends_after_the_lost_grace(
        livekit_server, start_serve, ready_worker, tmp_path):
    backend = await start_serve(plugin="scripted", max_sessions=2)
    backends = tmp_path / "backends.txt"
    backends.write_text(backend.realtime_url + "\n")  # a list of one: a pool, with its lost grace
    worker = await ready_worker(backend=f"@{backends}", max_sessions=2,
                                extra=("--backend-lost-grace", str(LOST_GRACE_S), "--backend-connect-timeout", "1"))
    alice = await _caller(livekit_server, "alice", "room-lost")
    events = EventsListener(alice)
    assert (await livekit_server.create_dispatch("room-lost", AGENT_NAME)).state == "assigned"
    await until(lambda: "listening" in alice.agent_states, 40, "the agent")
    await backend.until_sessions(1)

    # Mid-reply: the agent is speaking when its only backend is SIGKILLed.
    alice.mic.say(speak("Tell me a long story please.", 48000, before_ms=300, after_ms=1200))
    await until(lambda: "speaking" in alice.agent_states, 60, "the agent's reply")
    backend.process.kill()
    backend.process.wait(10)

    await until(lambda: events.first("error") is not None, 40, "the typed error in the room")
    error_at, error = events.first("error")
    assert error["error"]["code"] == "backend_unavailable", events.events
    await until(lambda: events.first("session.closed") is not None, 40, "the call's end")
    closed_at, closed = events.first("session.closed")
    assert closed["reason"] == "backend_lost", events.events
    # The call looked for another backend for the whole grace before it gave up (a lower bound only).
    assert closed_at - error_at >= 0.75 * LOST_GRACE_S, (closed_at - error_at, events.events)
    # Then the agent left the room, and the worker logged the call's end with its reason.
    await until(lambda: alice.agent_left, 30, "the agent to leave the room")
    assert "closed (backend_lost)" in worker.log()
    assert "Traceback" not in worker.log()
    await alice.leave()


async def test_two_callers_go_to_two_backends_by_capacity_and_a_full_pool_reports_full(
        livekit_server, start_serve, ready_worker):
    first_backend = await start_serve(plugin="scripted", max_sessions=1)
    second_backend = await start_serve(plugin="scripted", max_sessions=1)
    worker = await ready_worker(backend=first_backend.realtime_url, max_sessions=3,
                                extra=("--backend", second_backend.realtime_url))
    alice = await _caller(livekit_server, "alice", "room-a")
    bob = await _caller(livekit_server, "bob", "room-b")
    first = await livekit_server.create_dispatch("room-a", AGENT_NAME)
    assert first.state == "assigned"
    worker_id = livekit_server.jobs[first.job_id].worker_id
    await until(lambda: "listening" in alice.agent_states, 40, "alice's agent")
    # The worker's load is its pool's free capacity: one of the two backend sessions is taken
    # (its three local slots would say 1/3) once the pool has read that backend's /healthz.
    await until(lambda: livekit_server.workers[worker_id].load > 0.6, 20, "the load to count alice's backend")
    second = await livekit_server.create_dispatch("room-b", AGENT_NAME)
    assert second.state == "assigned"
    await until(lambda: "listening" in bob.agent_states, 40, "bob's agent")
    # One session on each backend, as each backend's own /healthz counts them.
    await first_backend.until_sessions(1)
    await second_backend.until_sessions(1)
    # Placed by the free sessions the backends report, not by trying the full one first.
    assert "serving bob" in worker.log() and "cooled down" not in worker.log(), worker.log()[-3000:]

    # Both backends are full: the worker, with a slot of its own left, reports full and is skipped;
    # the third room's job is not taken (so no refusal reaches anyone).
    await until(lambda: not livekit_server.workers[worker_id].available, 20, "the worker to report full")
    assert livekit_server.workers[worker_id].load >= 1.0
    carol = await _caller(livekit_server, "carol", "room-c")
    waiting = await livekit_server.create_dispatch("room-c", AGENT_NAME)
    assert waiting.state == "no_worker" and (worker_id, "full") in waiting.skipped, waiting

    # A backend's slot frees: the worker takes the waiting room, and carol's call goes there.
    await alice.leave()
    await until(lambda: waiting.state == "assigned", 40, "the waiting dispatch to be served")
    await until(lambda: "listening" in carol.agent_states, 40, "carol's agent")
    await first_backend.until_sessions(1)
    await second_backend.until_sessions(1)
    await asyncio.gather(bob.leave(), carol.leave())


async def test_a_worker_that_dies_mid_call_drops_it_and_the_backend_frees_its_session_after_the_resume_grace(
        livekit_server, start_serve, ready_worker):
    backend = await start_serve("--resume-grace-s", "5", plugin="scripted", max_sessions=2)
    worker = await ready_worker(backend=backend.realtime_url, max_sessions=2)
    alice = await _caller(livekit_server, "alice", "room-dies")
    events = EventsListener(alice)
    assert (await livekit_server.create_dispatch("room-dies", AGENT_NAME)).state == "assigned"
    await until(lambda: "listening" in alice.agent_states, 40, "the agent")
    await backend.until_sessions(1)

    worker.process.kill()
    worker.process.wait(10)
    # The caller sees the agent leave the room; nothing typed can reach it (its sender is gone).
    await until(lambda: alice.agent_left, 60, "the dead worker's agent to leave the room")
    assert events.events == []
    # The backend kept the session for a resume that never comes, then freed its slot.
    await backend.until_sessions(0, timeout=60)
    assert "kept 5 s for a resume" in backend.log(), backend.log()[-2000:]
    await alice.leave()
