"""The SIP bridge's own thread and event loop.

LiveKit's SIP service is a process of its own that joins rooms as a client; here its calls
run on a thread of their own, so that a call's audio (a line's filters, the SDK's frames)
never runs on the loop that forwards everyone's media.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class SipBridge:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        # The SDK makes its native client on first use, unguarded: make it here, before the
        # bridge's thread could race another thread to it.
        from livekit.rtc._ffi_client import FfiClient

        assert FfiClient.instance is not None
        ready: concurrent.futures.Future[asyncio.AbstractEventLoop] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="loopback-sip-bridge", daemon=True)
        self._thread.start()
        self._loop = ready.result(10)

    @staticmethod
    def _serve(ready: concurrent.futures.Future[asyncio.AbstractEventLoop]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ready.set_result(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def submit(self, fn: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Run ``fn()`` on the bridge's loop."""
        self.start()
        assert self._loop is not None

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` on the bridge's loop, awaited from another loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def read(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """``fn()`` run on the bridge's loop (it must return a snapshot); blocks the caller."""
        async def run() -> T:
            return fn()

        return self.submit(run).result(timeout)

    async def stop(self, before: Callable[[], Awaitable[None]]) -> None:
        """Run ``before()`` there (end the calls), then stop the thread."""
        if self._thread is None or self._loop is None:
            return
        try:
            await asyncio.wait_for(self.call(before), 20)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._thread = self._loop = None
