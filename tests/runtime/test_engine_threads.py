"""One in-process engine and one data plane shared by sessions on several threads, each
thread with its own event loop, as LiveKit jobs are."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.plugins.contract import DuplexAppendPlan, DuplexFence
from duplex_agent.plugins.contract.engine import StageOutput
from duplex_agent.plugins.engines.inprocess import InProcessEngine, PythonStage, StageRequest, StageYield
from duplex_agent.plugins.speech_data_plane import SpeechDataPlane


class EchoUntilStopped(PythonStage):
    """Answers every input; notes on which thread each request's task ended."""

    def __init__(self) -> None:
        self.ended_on: dict[str, int] = {}

    async def run(self, request: StageRequest) -> AsyncIterator[StageYield]:
        try:
            async for payload in request.inputs():
                yield StageYield(payload)
        finally:
            self.ended_on[request.request_id] = threading.get_ident()


class Job(threading.Thread):
    """A thread with its own loop holding one open request on the shared engine."""

    def __init__(self, engine: InProcessEngine, request_id: str) -> None:
        super().__init__(name=f"job-{request_id}", daemon=True)
        self.engine = engine
        self.request_id = request_id
        self.ready = threading.Event()
        self.go = threading.Event()
        self.abort_other: str | None = None
        self.outputs: list[StageOutput] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._job())
        except BaseException as exc:  # reported to the test
            self.error = exc

    async def _job(self) -> None:
        engine = self.engine
        await engine.submit(DuplexAppendPlan(self.request_id, 0, DuplexFence(0, 0), {"n": 1}, final=False))
        outputs = engine.outputs(self.request_id)
        self.outputs.append(await anext(outputs))
        self.ready.set()
        if self.abort_other is not None:
            await asyncio.to_thread(self.go.wait, 10)
            await engine.abort([self.abort_other])  # a request of another thread's loop
        async for output in outputs:  # until this request is stopped
            self.outputs.append(output)


async def test_abort_and_close_reach_requests_on_other_loops():
    stage = EchoUntilStopped()
    engine = InProcessEngine([stage])
    first, second = Job(engine, "sessA-t1-in-1"), Job(engine, "sessB-t1-in-1")
    second.abort_other = first.request_id
    for job in (first, second):
        job.start()
    for job in (first, second):
        assert await asyncio.to_thread(job.ready.wait, 10)

    # Thread B aborts thread A's request: it stops on A's own loop, and B's goes on.
    second.go.set()
    await asyncio.to_thread(first.join, 10)
    assert not first.is_alive() and first.error is None
    assert stage.ended_on[first.request_id] == first.ident
    assert second.is_alive() and second.request_id not in stage.ended_on

    # This (third) loop closes the engine: B's request stops on B's loop.
    await engine.close()
    await asyncio.to_thread(second.join, 10)
    assert not second.is_alive() and second.error is None
    assert stage.ended_on[second.request_id] == second.ident
    assert engine.active_request_count == 0


def test_data_plane_sessions_on_other_threads_do_not_lose_requests():
    plane = SpeechDataPlane(as_float32_audio, sample_rate=16000)
    for i in range(20_000):  # a big session makes rebuilding the set slow, widening any race
        plane.mark_terminal(f"sessBig-t1-in-{i}")
    marked: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def reporting(work):
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # e.g. "Set changed size during iteration"
                errors.append(exc)
        return run

    def mark() -> None:
        start.wait()
        for i in range(5_000):
            request_id = f"sessA-t{i}-in-{i}"
            plane.mark_terminal(request_id)
            marked.append(request_id)

    def close_others() -> None:
        start.wait()
        for i in range(200):
            plane.close_session(f"sessGone{i}")

    threads = [threading.Thread(target=reporting(mark)), threading.Thread(target=reporting(close_others))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert all(plane.is_terminal(r) for r in marked)
    plane.close_session("sessBig")
    assert plane.terminal_request_count == len(marked)
    for request_id in marked:
        plane.close_stream(request_id)
    assert plane.terminal_request_count == 0
