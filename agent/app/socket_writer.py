"""One attached websocket's writer: a realtime session's events reach it in order, and the
session never waits on it.

A session numbers and journals each event the moment its model makes it (``session_store``);
this writer then sends it on its own task. aiohttp's send waits while the socket's buffer is
full, and on a network that dropped without a reset that lasts until the kernel gives up,
minutes later. A session that waited there stopped reading its model, was cut off as a slow
client, and could not even answer the client's resume on a new socket. vLLM-Omni's server
never waits on a send (uvicorn buffers), and its session goes on for the resume.

So the writer keeps its own backlog. One where more than ``max_backlog_bytes`` already waits
when another event comes (a socket that takes nothing, or far too slowly) is told ``on_behind``; the session then ends this socket
(``end``: what is queued is dropped, a last notice goes, then a close) and keeps itself for a
resume, which replays from the journal. An end that cannot finish within ``end_timeout_s``
(the peer reads nothing) aborts the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from aiohttp import WSCloseCode, web


class SocketWriter:
    def __init__(self, ws: web.WebSocketResponse, abort: Callable[[], None], *, max_backlog_bytes: int,
                 on_behind: Callable[[SocketWriter], None], first: tuple[str, ...] = (),
                 end_timeout_s: float = 2.0) -> None:
        """``first``: what the socket is owed before anything else (a resume's answer and replay); it may
        take that much on top of ``max_backlog_bytes`` before it counts as behind."""
        self.ws = ws
        self.max_backlog_bytes = max_backlog_bytes + sum(len(text) for text in first)
        self.end_timeout_s = end_timeout_s
        self._abort = abort
        self._on_behind = on_behind
        self._queue: deque[tuple[str, float]] = deque()
        #: What is queued and not yet written: its size, and the agent audio in it.
        self.backlog_bytes = 0
        self.backlog_audio_ms = 0.0
        self.peak_backlog_bytes = 0
        self._ready = asyncio.Event()
        self._last: tuple[str, ...] | None = None  # set by ``end``
        self._close_code: int = WSCloseCode.OK
        self._give_up: asyncio.TimerHandle | None = None
        self._told_behind = False
        for text in first:
            self.put(text)
        self._task = asyncio.create_task(self._run(), name="realtime-socket-writer")

    @property
    def ending(self) -> bool:
        return self._last is not None

    def put(self, text: str, audio_ms: float = 0.0) -> None:
        """Queue one encoded event; never waits."""
        if self._last is not None:
            return
        # What waited before this event: one large event (a long ``instructions`` echoed) is not a slow socket.
        waiting = self.backlog_bytes
        self._queue.append((text, audio_ms))
        self.backlog_bytes += len(text)
        self.backlog_audio_ms += audio_ms
        self.peak_backlog_bytes = max(self.peak_backlog_bytes, self.backlog_bytes)
        self._ready.set()
        if waiting > self.max_backlog_bytes and not self._told_behind:
            self._told_behind = True
            self._on_behind(self)

    def end(self, *last: str, drop_queued: bool = False, close_code: int = WSCloseCode.OK) -> None:
        """Send what is queued (none of it with ``drop_queued``), then ``last``, then close the socket.
        Past ``end_timeout_s`` from now the connection is aborted instead."""
        if self._last is not None:
            return
        if drop_queued:
            self._queue.clear()
            self.backlog_bytes = 0
            self.backlog_audio_ms = 0.0
        self._last = last
        self._close_code = close_code
        self._give_up = asyncio.get_running_loop().call_later(self.end_timeout_s, self._abort_now)
        self._ready.set()

    async def wait(self) -> None:
        """Until the writer's task is over (after ``end``, within its timeout)."""
        await asyncio.gather(self._task, return_exceptions=True)

    async def stop(self) -> None:
        """The socket is gone: stop at once, sending nothing more."""
        self._task.cancel()
        await self.wait()

    async def _run(self) -> None:
        try:
            with contextlib.suppress(ConnectionError, RuntimeError):  # the socket went away: its handler sees it
                while True:
                    if not self._queue:
                        if self._last is not None:
                            break
                        self._ready.clear()
                        await self._ready.wait()
                        continue
                    text, audio_ms = self._queue.popleft()
                    self.backlog_bytes -= len(text)
                    self.backlog_audio_ms -= audio_ms
                    if not self.ws.closed:
                        await self.ws.send_str(text)
                for text in self._last or ():
                    if not self.ws.closed:
                        await self.ws.send_str(text)
                await self.ws.close(code=self._close_code)
        finally:
            if self._give_up is not None:
                self._give_up.cancel()

    def _abort_now(self) -> None:
        """The end took too long (the peer reads nothing): drop the connection, which ends the task's send."""
        self._abort()
        self._task.cancel()
