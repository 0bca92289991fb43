"""An engine that runs Python stages in this process.

Each stage request is one asyncio task fed by an input queue; blocking model
work goes to a bounded thread pool shared by all sessions, so the event loop
never waits on a model. Aborting a request cancels its task and raises its
``cancelled`` flag, which long blocking work checks between chunks.

One engine may serve sessions on several event loops (LiveKit jobs are threads,
each with its own loop). A request belongs to the loop that opened it: its task
and queues are only touched there, so an abort or close from another thread is
handed to the owning loop (``run_in_owner_loops``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from duplex_agent.plugins.contract import DuplexAppendPlan
from duplex_agent.plugins.contract.engine import (
    DuplexEngine,
    EngineSubmitError,
    StageFailure,
    StageOutput,
    read_stage_outputs,
)
from duplex_agent.plugins.contract.loops import run_in_owner_loops

log = logging.getLogger("duplex_agent.engine")

T = TypeVar("T")
_END = object()
#: How long an abort waits for another loop to stop its requests.
CROSS_LOOP_STOP_S = 5.0


@dataclass(slots=True)
class StageYield:
    """One output of a Python stage; ``finished`` ends the request."""

    output: object
    finished: bool = False
    token_ids: tuple[int, ...] = ()
    metadata: dict[str, object] = field(default_factory=dict)


class StageRequest:
    """What a stage sees of one request: its inputs, its cancel flag, the pool."""

    def __init__(self, request_id: str, stage_id: int, sampling_params: object, executor: ThreadPoolExecutor) -> None:
        self.request_id = request_id
        self.stage_id = stage_id
        self.sampling_params = sampling_params
        self.cancelled = threading.Event()
        self._inputs: asyncio.Queue[object] = asyncio.Queue()
        self._executor = executor

    async def inputs(self) -> AsyncIterator[object]:
        """Payloads in submit order, until the final plan."""
        while True:
            item = await self._inputs.get()
            if item is _END:
                return
            yield item

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work on the engine's pool."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class PythonStage(ABC):
    """One model stage written in Python."""

    def accept(self, payload: object) -> None:  # noqa: B027 (an optional hook: subclasses need not override it)
        """Check a payload at submit time; raise to refuse it (the runner rolls back)."""

    @abstractmethod
    def run(self, request: StageRequest) -> AsyncIterator[StageYield]: ...


@dataclass(slots=True)
class _Request:
    stage: PythonStage
    handle: StageRequest
    outputs: asyncio.Queue[StageOutput | None]
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[None] | None = None
    closed: bool = False


class InProcessEngine(DuplexEngine):
    def __init__(self, stages: Sequence[PythonStage], *, max_workers: int = 2) -> None:
        if not stages:
            raise ValueError("an engine needs at least one stage")
        self._stages = tuple(stages)
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="duplex-stage")
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()  # _requests is shared by every loop's thread

    @property
    def stage_count(self) -> int:
        return len(self._stages)

    @property
    def active_request_count(self) -> int:
        return len(self._requests)

    async def submit(self, plan: DuplexAppendPlan) -> None:
        if not 0 <= plan.stage_id < len(self._stages):
            raise EngineSubmitError(f"no stage {plan.stage_id}")
        request = self._requests.get(plan.request_id)
        if request is None:
            stage = self._stages[plan.stage_id]
            handle = StageRequest(plan.request_id, plan.stage_id, plan.sampling_params, self._executor)
            request = _Request(stage, handle, asyncio.Queue(), asyncio.get_running_loop())
            with self._lock:
                self._requests[plan.request_id] = request
            request.task = asyncio.create_task(self._run(request), name=f"stage-{plan.request_id}")
        elif request.closed or request.task is None or request.task.done():
            raise EngineSubmitError(f"request {plan.request_id} takes no more input")
        try:
            request.stage.accept(plan.payload)
        except Exception as exc:
            raise EngineSubmitError(f"stage {plan.stage_id} refused input: {exc}") from exc
        request.handle._inputs.put_nowait(plan.payload)
        if plan.final or not plan.resumable:
            request.handle._inputs.put_nowait(_END)
            request.closed = True

    async def outputs(self, request_id: str) -> AsyncIterator[StageOutput]:
        request = self._requests.get(request_id)
        if request is None:
            return
        try:
            async for item in read_stage_outputs(request.outputs):
                yield item
        finally:
            with self._lock:
                if self._requests.get(request_id) is request:
                    del self._requests[request_id]
            if request.task is not None and not request.task.done():
                # Nobody reads this request any more: stop its work.
                request.handle.cancelled.set()
                request.task.cancel()

    async def abort(self, request_ids: Iterable[str]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        with self._lock:
            for request_id in request_ids:
                request = self._requests.pop(request_id, None)
                if request is not None:
                    request.handle.cancelled.set()  # thread-safe: blocking work sees it at once
                    by_loop.setdefault(request.loop, []).append(request)
        # A loop that no longer runs took its tasks with it; the cancel flags are set.
        await run_in_owner_loops(((loop, partial(_stop, requests)) for loop, requests in by_loop.items()),
                                 timeout_s=CROSS_LOOP_STOP_S)

    async def close(self) -> None:
        with self._lock:
            request_ids = list(self._requests)
        await self.abort(request_ids)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, request: _Request) -> None:
        handle = request.handle
        finished = False
        try:
            async for result in request.stage.run(handle):
                finished = result.finished
                request.outputs.put_nowait(
                    StageOutput(handle.request_id, handle.stage_id, result.output, result.finished,
                                result.token_ids, result.metadata)
                )
                if finished:
                    break
            if not finished:
                request.outputs.put_nowait(StageOutput(handle.request_id, handle.stage_id, None, True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing stage ends its request with an error output
            if isinstance(exc, StageFailure):  # understood: the operator gets the detail, the caller a sentence
                log.warning("%s: stage %d failed: %s", handle.request_id, handle.stage_id, exc.detail)
                error = str(exc)
            else:
                log.exception("%s: stage %d failed", handle.request_id, handle.stage_id)
                error = f"stage {handle.stage_id} failed: {type(exc).__name__}: {exc}"
            request.outputs.put_nowait(StageOutput(handle.request_id, handle.stage_id, None, True, error=error))
        finally:
            request.closed = True


async def _stop(requests: list[_Request]) -> None:
    """On the requests' own loop: end their output streams, cancel their tasks and wait for them."""
    tasks = []
    for request in requests:
        request.outputs.put_nowait(None)
        if request.task is not None:
            request.task.cancel()
            tasks.append(request.task)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
