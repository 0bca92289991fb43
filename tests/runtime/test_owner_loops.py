"""run_in_owner_loops: each close runs in the loop that owns what it closes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from duplex_agent.plugins.contract.loops import run_in_owner_loops


@pytest.fixture
def other_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on its own thread (as a LiveKit job's does)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="other-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def recorder(seen: list[tuple[str, asyncio.AbstractEventLoop]], name: str):
    async def close() -> None:
        seen.append((name, asyncio.get_running_loop()))
    return close


async def test_a_close_from_another_loops_thread_runs_in_its_owner(other_loop):
    seen: list[tuple[str, asyncio.AbstractEventLoop]] = []
    here = asyncio.get_running_loop()
    ran = await run_in_owner_loops([(other_loop, recorder(seen, "there")), (here, recorder(seen, "here"))],
                                   timeout_s=30)
    assert ran == 2
    assert sorted(seen, key=lambda s: s[0]) == [("here", here), ("there", other_loop)]


async def test_a_close_in_the_same_loop_is_awaited_in_it():
    seen: list[tuple[str, asyncio.AbstractEventLoop]] = []
    assert await run_in_owner_loops([(asyncio.get_running_loop(), recorder(seen, "here"))], timeout_s=30) == 1
    assert seen == [("here", asyncio.get_running_loop())]


async def test_a_closed_loop_is_skipped_and_no_coroutine_is_made():
    dead = asyncio.new_event_loop()
    dead.close()
    made: list[str] = []

    def make():
        made.append("made")
        return asyncio.sleep(0)

    assert await run_in_owner_loops([(dead, make)], timeout_s=30) == 0
    assert made == []


async def test_a_failing_close_does_not_stop_the_others(other_loop):
    seen: list[tuple[str, asyncio.AbstractEventLoop]] = []

    async def fails() -> None:
        raise RuntimeError("boom")

    ran = await run_in_owner_loops([(other_loop, fails), (other_loop, recorder(seen, "after"))], timeout_s=30)
    assert ran == 2 and seen == [("after", other_loop)]


async def test_a_close_that_never_ends_in_another_loop_is_given_up_on(other_loop):
    started, cancelled = threading.Event(), threading.Event()

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    assert await run_in_owner_loops([(other_loop, hangs)], timeout_s=0.5) == 1  # returns: the wait is bounded
    # cancelled in its own loop, not left running (a loaded machine may cancel it before it began)
    assert await asyncio.to_thread(cancelled.wait, 30) or not started.is_set()
