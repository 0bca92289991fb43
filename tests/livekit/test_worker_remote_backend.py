"""The production combination: a LiveKit worker (``start --backend``) whose model runs on a
second process's ``/v1/realtime?duplex=1`` (here ``serve`` with the reference model, as a
vLLM-Omni server would be on a GPU). Jobs are threads with their own loops; each must get
working connections of its own, and the worker's load must follow the backend's capacity."""

from __future__ import annotations

import asyncio

from devtools.speech import speak, words
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import AGENT_NAME
from tests.support.heard import reply_heard
from tests.support.waits import until

LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")


async def _caller(livekit_server, identity: str, room: str) -> LiveKitCaller:
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token(identity, room))
    await caller.join()
    return caller


async def test_two_callers_at_once_each_hear_their_own_reply_through_the_remote_backend(
        livekit_server, start_serve, ready_worker):
    backend = await start_serve(plugin="reference", max_sessions=4)
    worker = await ready_worker(backend=backend.realtime_url, max_sessions=2)
    alice = await _caller(livekit_server, "alice", "room-alice")
    bob = await _caller(livekit_server, "bob", "room-bob")
    dispatches = await asyncio.gather(*(livekit_server.create_dispatch(room, AGENT_NAME)
                                        for room in ("room-alice", "room-bob")))
    assert [d.state for d in dispatches] == ["assigned", "assigned"]
    await until(lambda: "listening" in alice.agent_states and "listening" in bob.agent_states, 40,
                   "both agents")

    # Both talk at once; each hears the echo of their own words and none of the other's.
    table, london = "Please book a table for two people tonight.", "What is the weather like in London tomorrow?"
    heard_alice, heard_bob = await asyncio.gather(alice.say_and_hear(table), bob.say_and_hear(london))
    # On failure: what the caller heard, and the agent's own transcript (which leg lost the word).
    assert reply_heard(heard_alice, "You said: " + table) and not {"london", "weather"} & set(words(heard_alice)), \
        (heard_alice, [t.text for t in alice.agent_replies()])
    assert reply_heard(heard_bob, "You said: " + london) and not {"table", "tonight"} & set(words(heard_bob)), \
        (heard_bob, [t.text for t in bob.agent_replies()])
    # Two sessions on the backend, one per job, opened from the jobs' own threads.
    assert (await backend.health())["sessions"] == 2
    assert "Timeout context manager" not in worker.log() and "Traceback" not in worker.log()

    # Barge-in on this path: once the long reply is generated and playing, alice talks over it.
    alice.mic.say(speak(LONG, 48000, before_ms=300, after_ms=1200))

    def long_reply():  # its full transcript: the whole reply is generated (and queued to play)
        return next((t for t in alice.agent_replies() if words(t.text)[:3] == ["you", "said", "i"]), None)

    await until(lambda: long_reply() is not None and alice.state_log[-1][0] == "speaking", 90,
                   "the long reply to be generated and playing")
    segment, full = long_reply().attributes["lk.segment_id"], words(long_reply().text)
    cut = len(alice.received)
    alice.mic.say(speak("Wait, stop please.", 48000, after_ms=1200))

    def heard() -> list[str] | None:  # the reply's final transcript again, cut to what alice heard
        finals = [t for t in alice.agent_replies() if t.attributes.get("lk.segment_id") == segment]
        return words(finals[-1].text) if len(finals) > 1 else None

    await until(lambda: heard() is not None, 40, "the long reply to be cut short")
    assert 0 < len(heard()) < len(full) and heard() == full[: len(heard())], (heard(), full)

    def quiet_at() -> int | None:
        return next((at for state, at in alice.state_log if at >= cut and state == "listening"), None)

    await until(lambda: quiet_at() is not None, 30, "the agent to go quiet")
    # Left alone, the rest of the reply would have played for seconds more: it stopped within the
    # caller's interruption (its onset) plus the way back through the SFU.
    assert quiet_at() - cut < 0.5 * len(speak(LONG, 100)), quiet_at() - cut

    await asyncio.gather(alice.leave(), bob.leave())
    await until(lambda: worker.log().count("closed (caller_left)") + worker.log().count("closed (room_closed)") >= 2,
                   30, "both sessions to close")


async def test_a_worker_whose_backend_is_full_reports_full_and_is_not_dispatched_to(
        livekit_server, start_serve, ready_worker):
    backend = await start_serve(plugin="scripted", max_sessions=1)
    await ready_worker(backend=backend.realtime_url, max_sessions=3)
    first = await _caller(livekit_server, "alice", "room-a")
    dispatch_a = await livekit_server.create_dispatch("room-a", AGENT_NAME)
    assert dispatch_a.state == "assigned"
    await backend.until_sessions(1)  # the backend's only slot

    # The worker has two slots of its own left, but its backend has none: it reports full.
    worker_id = livekit_server.jobs[dispatch_a.job_id].worker_id
    await until(lambda: not livekit_server.workers[worker_id].available, 20, "the worker to report full")
    dispatch_b = await livekit_server.create_dispatch("room-b", AGENT_NAME)
    assert dispatch_b.state == "no_worker" and (worker_id, "full") in dispatch_b.skipped

    # The backend's slot frees: the worker is available again and takes the waiting room.
    await first.leave()
    await until(lambda: dispatch_b.state == "assigned", 40, "the waiting dispatch to be served")
