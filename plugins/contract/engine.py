"""The engine port: how the runner reaches a model's stages.

A stage request is opened by its first plan, takes more input while plans are
resumable (streaming input), and closes on a final plan. Its outputs stream
back until one is marked finished. Requests are aborted by id. The in-process
engine, a vLLM engine (streaming-input requests, ``abort``) and a remote server
all fit this shape.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from duplex_agent.plugins.contract.types import DuplexAppendPlan


class EngineSubmitError(RuntimeError):
    """A stage refused a plan; the runner rolls the input back."""


class StageFailure(RuntimeError):
    """A stage failed for a reason told to two readers.

    ``str(exc)`` is one plain sentence for the caller (the ``error`` event's message, which
    the page shows): no internals, no secrets. ``detail`` is the operator's: what failed
    and why, in words, for the log. A stage raises it for a failure it understands (an
    endpoint it cannot reach); any other exception is a fault, logged with its traceback.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


@dataclass(frozen=True, slots=True)
class StageOutput:
    request_id: str
    stage_id: int
    output: object
    #: The stage request ended with this output; no more follow.
    finished: bool = False
    token_ids: tuple[int, ...] = ()
    metadata: dict[str, object] = field(default_factory=dict)
    #: Set when the stage failed (``finished`` is then True): the message the caller is given.
    error: str | None = None


class DuplexEngine(ABC):
    """Runs one model's stages for every session of a worker."""

    #: Optional: called with the lag (ms) of each step that overran its frame. Only a
    #: frame-clocked engine has steps to overrun; the others never call it.
    on_overrun: Callable[[float], None] | None = None

    @property
    @abstractmethod
    def stage_count(self) -> int: ...

    @property
    def sampling_defaults(self) -> tuple[object, ...]:
        """One default sampling parameter per stage (None where a stage has none)."""
        return (None,) * self.stage_count

    @abstractmethod
    async def submit(self, plan: DuplexAppendPlan) -> None:
        """Open or extend the stage request ``plan.request_id``; raise EngineSubmitError if refused."""

    @abstractmethod
    def outputs(self, request_id: str) -> AsyncIterator[StageOutput]:
        """Stream a submitted request's outputs until it finishes or is aborted."""

    @abstractmethod
    async def abort(self, request_ids: Iterable[str]) -> None:
        """Stop these requests now; their streams end without a finished output."""

    async def close(self) -> None:  # noqa: B027 (an optional hook: subclasses need not override it)
        """Release the engine's resources."""


async def read_stage_outputs(queue: asyncio.Queue[StageOutput | None]) -> AsyncIterator[StageOutput]:
    """An engine's per-request output queue as a stream: up to a finished output, or None (aborted)."""
    while (item := await queue.get()) is not None:
        yield item
        if item.finished:
            return


def request_session_id(request_id: str) -> str:
    """The session a runner-made request id belongs to (ids are ``<session>-<scope>...``)."""
    return request_id.split("-", 1)[0]
