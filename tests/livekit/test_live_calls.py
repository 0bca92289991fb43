"""LiveCalls.close_all closes each call in its job's loop (no server needed)."""

from __future__ import annotations

import asyncio
import threading

import pytest

worker = pytest.importorskip("duplex_agent.agent.app.livekit_worker")


class Call:
    """A room call's close, recorded with the loop it ran in."""

    def __init__(self) -> None:
        self.closed: list[tuple[str, asyncio.AbstractEventLoop]] = []

    def finish_after_current(self) -> None: ...

    async def close(self, reason: str) -> None:
        self.closed.append((reason, asyncio.get_running_loop()))


async def test_close_all_closes_each_call_in_its_jobs_loop_and_skips_a_stopped_one():
    calls = worker.LiveCalls()
    job_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=job_loop.run_forever, name="job", daemon=True)
    thread.start()
    stopped_loop = asyncio.new_event_loop()
    try:
        in_job, in_stopped = Call(), Call()

        async def add(call: Call) -> None:
            calls.add(call)

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(add(in_job), job_loop))
        # a job whose loop ran the call's start, then stopped
        await asyncio.to_thread(stopped_loop.run_until_complete, add(in_stopped))
        assert len(calls) == 2
        await calls.close_all("shutdown")
        assert in_job.closed == [("shutdown", job_loop)]
        assert in_stopped.closed == []
    finally:
        job_loop.call_soon_threadsafe(job_loop.stop)
        thread.join(10)
        job_loop.close()
        stopped_loop.close()
