"""Running a close (or an abort) in the event loop that owns what it closes.

One process may hold work on several event loops (LiveKit jobs are threads, each
with its own loop). A task or queue is only touched in its own loop, so a close
from another thread is handed to the owning loop and waited for, bounded: that
loop may be stopping too. A loop that no longer runs took its tasks with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

#: Makes the coroutine to run; called only once it will run, so none is left unawaited.
MakeCoroutine = Callable[[], Coroutine[Any, Any, Any]]


async def run_in_owner_loops(work: Iterable[tuple[asyncio.AbstractEventLoop, MakeCoroutine]], *,
                             timeout_s: float) -> int:
    """Run each coroutine in its own loop, together, and wait for them all; returns how many ran.

    In the running loop a coroutine is awaited as it is; one in another running loop is
    given ``timeout_s`` (then cancelled there); one whose loop has stopped is skipped.
    Errors are swallowed: one close that fails must not stop the others.
    """
    here = asyncio.get_running_loop()
    waits: list[Any] = []
    for loop, make in work:
        if loop is here:
            waits.append(make())
        elif loop.is_running():
            coroutine = make()
            try:
                future = asyncio.run_coroutine_threadsafe(coroutine, loop)
            except RuntimeError:  # it closed just now
                coroutine.close()
                continue
            waits.append(asyncio.wait_for(asyncio.wrap_future(future), timeout_s))
    if waits:
        await asyncio.gather(*waits, return_exceptions=True)
    return len(waits)
