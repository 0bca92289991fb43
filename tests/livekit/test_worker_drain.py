"""The LiveKit worker drains as livekit-agents workers do: the first SIGTERM or SIGINT stops new
jobs (the server sees it unavailable), live calls go on until they end or the drain timeout
closes them (reason ``shutdown``, the agent leaves the room), and it exits 0; a second signal
exits at once."""

from __future__ import annotations

import signal

from devtools.speech import words
from tests.livekit.caller import LiveKitCaller
from tests.livekit.conftest import AGENT_NAME
from tests.support.waits import until


async def _in_a_call(livekit_server, worker, room: str = "call") -> tuple[LiveKitCaller, str]:
    caller = LiveKitCaller(livekit_server.url, livekit_server.mint_token("alice", room))
    await caller.join()
    dispatch = await livekit_server.create_dispatch(room, AGENT_NAME)
    assert dispatch.state == "assigned"
    await until(lambda: "serving alice" in worker.log(), 60, "the agent to take the call")
    return caller, livekit_server.jobs[dispatch.job_id].worker_id


async def test_sigterm_drains_the_live_call_goes_on_until_the_caller_hangs_up(livekit_server, ready_worker):
    worker = await ready_worker(drain_timeout=120)
    caller, worker_id = await _in_a_call(livekit_server, worker)
    assert "table" in words(await caller.say_and_hear("Please book a table for two people tonight."))

    worker.signal(signal.SIGTERM)
    # The server sees the worker unavailable and does not dispatch to it.
    await until(lambda: not livekit_server.workers[worker_id].available, 20, "the worker to report draining")
    refused = await livekit_server.create_dispatch("another-room", AGENT_NAME)
    assert refused.state == "no_worker" and (worker_id, "full") in refused.skipped

    # The live call keeps talking.
    heard = words(await caller.say_and_hear("What is the weather like in London tomorrow?"))
    assert {"weather", "london"} & set(heard), heard
    assert worker.process.poll() is None

    # The caller hangs up: the worker exits 0, long before the drain timeout.
    await caller.leave()
    assert await worker.exited(timeout=60) == 0
    assert "closed (caller_left)" in worker.log() and "Traceback" not in worker.log()


async def test_sigint_at_the_drain_timeout_closes_the_call_with_reason_shutdown(livekit_server, ready_worker):
    worker = await ready_worker(plugin="scripted", drain_timeout=3)
    caller, _ = await _in_a_call(livekit_server, worker)
    worker.signal(signal.SIGINT)
    # The caller stays: at the drain timeout the session closes and the agent leaves the room.
    await until(lambda: caller.agent_left, 60, "the agent to leave the room")
    assert await worker.exited(timeout=60) == 0
    assert "closed (shutdown)" in worker.log()
    await caller.leave()


async def test_a_second_signal_exits_at_once(livekit_server, ready_worker):
    worker = await ready_worker(plugin="scripted", drain_timeout=120)
    caller, worker_id = await _in_a_call(livekit_server, worker)
    worker.signal(signal.SIGTERM)
    await until(lambda: not livekit_server.workers[worker_id].available, 20, "the worker to drain")
    worker.signal(signal.SIGTERM)
    assert await worker.exited(timeout=20) == 128 + signal.SIGTERM  # the live call did not hold it
    await caller.leave()
