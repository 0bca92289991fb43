"""An engine for frame-synchronous models: one clock, one batch slot per live session.

A frame-synchronous model (Moshi-type: it listens and speaks in fixed frames) is stepped for
every conversation at once. The engine keeps one clock per process at the model's frame rate;
each live session owns one slot of a fixed-size batch. On every tick the engine takes each
slot's next input frame (silence if it has not arrived: a late session never holds the others
back), steps the whole batch in one call on its own thread, and hands each slot's output to
the stage request that session has open.

A session takes a slot with its first input and keeps it across its stage requests (a
cancel opens a new request, the conversation goes on); its slot is reset when it joins and
freed (masked out, then reused) when the session closes (``release_session``). A step that
overruns the frame is reported on its outputs (``lag_ms``, which the runner turns into
``session.lagging``) and to ``on_overrun``: the clock never drifts silently.

The model is anything with this shape (``BatchedFrameModel``); nothing here knows torch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from duplex_agent.plugins.contract import DuplexAppendPlan
from duplex_agent.plugins.contract.engine import (
    DuplexEngine,
    EngineSubmitError,
    StageOutput,
    read_stage_outputs,
    request_session_id,
)

log = logging.getLogger("duplex_agent.frame_batch")


class BatchedFrameModel(Protocol):
    capacity: int
    frame_samples: int
    sample_rate: int

    def reset_slots(self, slots: Sequence[int]) -> None:
        """Fresh state in these slots."""

    def step(self, frames: np.ndarray, active: np.ndarray) -> Sequence[object | None]:
        """One frame per slot ([capacity, frame_samples] float32); inactive slots keep their state.
        Returns one output per slot (None: nothing for that slot this frame)."""


class SlotsExhausted(EngineSubmitError):
    """Every batch slot is taken (the backend's --max-sessions admission should have refused first)."""

    code = "resource_exhausted"


@dataclass(slots=True)
class _Request:
    request_id: str
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[StageOutput | None] = field(default_factory=asyncio.Queue)
    final: bool = False


@dataclass(slots=True)
class _Slot:
    session_id: str
    inputs: deque[np.ndarray] = field(default_factory=deque)
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    request: _Request | None = None
    needs_reset: bool = True


@dataclass(slots=True)
class FrameBatchStats:
    steps: int = 0
    overruns: int = 0
    skipped_ticks: int = 0
    #: Ticks at which a live session's input had not arrived (it got silence).
    late_frames: int = 0
    #: Input frames dropped because a session had sent more than ``max_queued_frames`` ahead.
    dropped_frames: int = 0
    step_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))


class FrameBatchEngine(DuplexEngine):
    """One stage: a frame-synchronous model stepped for every session together."""

    def __init__(self, model: BatchedFrameModel, *, max_queued_frames: int = 4,
                 on_overrun: Callable[[float], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 thread_name: str = "frame-batch", clocked: bool = True) -> None:
        self.model = model
        self.capacity = model.capacity
        self.frame_samples = model.frame_samples
        self.period_s = model.frame_samples / model.sample_rate
        self.max_queued_frames = max_queued_frames
        self.on_overrun = on_overrun
        self.stats = FrameBatchStats()
        self._clock = clock
        self._thread_name = thread_name
        #: False: no clock thread; the owner steps with ``tick`` (tests that step exactly).
        self._clocked = clocked
        self._lock = threading.Lock()
        self._slots: list[_Slot | None] = [None] * self.capacity
        self._sessions: dict[str, int] = {}
        self._requests: dict[str, _Request] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the engine port ----

    @property
    def stage_count(self) -> int:
        return 1

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def slot_of(self, session_id: str) -> int | None:
        with self._lock:
            return self._sessions.get(session_id)

    async def submit(self, plan: DuplexAppendPlan) -> None:
        if plan.stage_id != 0:
            raise EngineSubmitError(f"no stage {plan.stage_id}")
        audio = _payload_audio(plan.payload)
        session_id = request_session_id(plan.request_id)
        with self._lock:
            slot_index = self._sessions.get(session_id)
            if slot_index is None:
                slot_index = self._take_slot(session_id)
            slot = self._slots[slot_index]
            assert slot is not None
            request = self._requests.get(plan.request_id)
            if request is None:
                request = _Request(plan.request_id, asyncio.get_running_loop())
                self._requests[plan.request_id] = request
                slot.request = request
            elif request.final or slot.request is not request:
                raise EngineSubmitError(f"request {plan.request_id} takes no more input")
            self._queue_audio(slot, audio)
            request.final = plan.final or not plan.resumable
        self._wake.set()
        self._ensure_clock()

    def outputs(self, request_id: str) -> AsyncIterator[StageOutput]:
        """The request's outputs; bound to it now, so what was delivered before an abort is still read."""
        with self._lock:
            request = self._requests.get(request_id)
        return self._read(request)

    async def _read(self, request: _Request | None) -> AsyncIterator[StageOutput]:
        if request is None:
            return
        try:
            async for item in read_stage_outputs(request.outputs):
                yield item
        finally:
            with self._lock:
                if self._requests.get(request.request_id) is request:
                    del self._requests[request.request_id]

    async def abort(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            for request_id in request_ids:
                request = self._requests.pop(request_id, None)
                if request is None:
                    continue
                for slot in self._slots:
                    if slot is not None and slot.request is request:
                        slot.request = None
                request.outputs.put_nowait(None)

    def release_session(self, session_id: str) -> None:
        """The session closed: its slot is masked out from the next tick and free for reuse."""
        with self._lock:
            slot_index = self._sessions.pop(session_id, None)
            if slot_index is None:
                return
            slot = self._slots[slot_index]
            self._slots[slot_index] = None
            if slot is not None and slot.request is not None:
                self._requests.pop(slot.request.request_id, None)
                slot.request.loop.call_soon_threadsafe(slot.request.outputs.put_nowait, None)

    async def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        with self._lock:
            for request in self._requests.values():
                request.loop.call_soon_threadsafe(request.outputs.put_nowait, None)
            self._requests.clear()

    # ---- the clock ----

    def start(self) -> None:
        """Start the clock thread (``submit`` does it on first use)."""
        self._ensure_clock()

    def tick(self) -> float:
        """One step of every live slot, on the calling thread; returns its duration in seconds.

        The clock thread steps once per frame; an engine built with ``clocked=False`` is stepped
        only by calls to this (tests that step exactly).
        """
        started = time.perf_counter()
        self._deliver(self._step(), lag_ms=None)
        return time.perf_counter() - started

    def _ensure_clock(self) -> None:
        if self._clocked and self._thread is None and not self._stopping.is_set():
            self._thread = threading.Thread(target=self._run_clock, name=self._thread_name, daemon=True)
            self._thread.start()

    def _run_clock(self) -> None:
        due: float | None = None
        while not self._stopping.is_set():
            if not self.active_sessions:
                due = None  # idle: wait for a session instead of ticking
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            now = self._clock()
            if due is None:
                due = now
            elif now < due:
                self._stopping.wait(due - now)
                continue
            try:
                pending = self._step()
            except Exception:
                log.exception("frame step failed")
                self._fail_all("frame step failed")
                return
            # The step that starts at ``due`` owes its outputs one period later.
            due += self.period_s
            ended = self._clock()
            lag_ms = None
            if ended > due:
                lag_ms = 1000.0 * (ended - due)
                self.stats.overruns += 1
                if self.on_overrun is not None:
                    self.on_overrun(lag_ms)
            self._deliver(pending, lag_ms)
            if ended - due > self.period_s:
                # More than a whole frame behind: skip the ticks that cannot be served (their
                # input queues up, bounded by max_queued_frames) rather than burst to catch up.
                skipped = int((ended - due) / self.period_s)
                self.stats.skipped_ticks += skipped
                due += skipped * self.period_s

    # ---- one step ----

    def _step(self) -> list[tuple[_Request | None, object | None, bool]]:
        """Steps the batch; returns (request, output, request finished) per slot, not yet delivered."""
        frames = np.zeros((self.capacity, self.frame_samples), dtype=np.float32)
        active = np.zeros(self.capacity, dtype=bool)
        resets: list[int] = []
        targets: list[tuple[_Request | None, bool]] = [(None, False)] * self.capacity
        with self._lock:
            for index, slot in enumerate(self._slots):
                if slot is None:
                    continue
                active[index] = True
                if slot.needs_reset:
                    resets.append(index)
                    slot.needs_reset = False
                if slot.inputs:
                    frames[index] = slot.inputs.popleft()
                else:
                    self.stats.late_frames += 1
                request = slot.request
                ends = request is not None and request.final and not slot.inputs
                if ends:
                    slot.request = None
                targets[index] = (request, ends)
        started = time.perf_counter()
        if resets:
            self.model.reset_slots(resets)
        results: Sequence[object | None] = [None] * self.capacity
        if active.any():
            results = self.model.step(frames, active)
        self.stats.steps += 1
        self.stats.step_ms.append(1000.0 * (time.perf_counter() - started))
        return [(request, result, ends) for (request, ends), result in zip(targets, results, strict=True)]

    def _deliver(self, pending: list[tuple[_Request | None, object | None, bool]], lag_ms: float | None) -> None:
        metadata = {"lag_ms": lag_ms} if lag_ms is not None else {}
        for request, result, ends in pending:
            if request is None or (result is None and not ends):
                continue
            with self._lock:
                if self._requests.get(request.request_id) is not request:
                    continue  # aborted or released meanwhile
            out = StageOutput(request.request_id, 0, result, ends, metadata=dict(metadata))
            request.loop.call_soon_threadsafe(request.outputs.put_nowait, out)

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            for request in self._requests.values():
                out = StageOutput(request.request_id, 0, None, True, error=f"stage 0 failed: {reason}")
                request.loop.call_soon_threadsafe(request.outputs.put_nowait, out)

    # ---- slots and input ----

    def _take_slot(self, session_id: str) -> int:
        for index, slot in enumerate(self._slots):
            if slot is None:
                self._slots[index] = _Slot(session_id)
                self._sessions[session_id] = index
                return index
        raise SlotsExhausted(f"resource_exhausted: all {self.capacity} batch slots are in use")

    def _queue_audio(self, slot: _Slot, audio: np.ndarray) -> None:
        if slot.partial.size:
            audio = np.concatenate([slot.partial, audio])
        whole = audio.size // self.frame_samples
        for index in range(whole):
            slot.inputs.append(audio[index * self.frame_samples:(index + 1) * self.frame_samples])
        slot.partial = audio[whole * self.frame_samples:].copy()
        while len(slot.inputs) > self.max_queued_frames:
            slot.inputs.popleft()  # keep the session's latency bounded: the oldest audio goes
            self.stats.dropped_frames += 1


def _payload_audio(payload: object) -> np.ndarray:
    if not isinstance(payload, dict) or not isinstance(payload.get("audio"), bytes | bytearray):
        raise EngineSubmitError("a frame engine takes payloads with float32 'audio' bytes")
    data = payload["audio"]
    if len(data) % 4:
        raise EngineSubmitError("audio bytes are not whole float32 samples")
    return np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)
