"""Waiting on a real signal: a condition polled until it holds or a deadline fails the test."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout: float, what: str,
                every: float = 0.02) -> None:
    """Returns once ``condition()`` (plain or awaitable) is true; fails the test naming ``what``
    if it is not within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
