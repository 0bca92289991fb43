"""A long-running worker's heap: calls' garbage is collected as the calls go, start-up's never scanned.

A call leaves reference cycles behind (peer connections, tasks, audio buffers), which only a full
collection frees. CPython runs one rarely in a process as large as a worker, so between them its
memory climbs by many calls' worth, and the allocator keeps that peak for good. The worker runs
a full collection on a fixed beat instead. What start-up loaded (the models, the imported
libraries) is frozen out of collections first (``gc.freeze``): each one then scans only what the
calls made, short enough to run on the loop that carries their audio.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("duplex_agent.heap")

#: Between two full collections: a few calls' garbage at most, on a busy worker.
COLLECT_EVERY_S = 15.0


def keep_the_heap(every_s: float = COLLECT_EVERY_S) -> asyncio.Task[None]:
    """Freezes what start-up loaded and collects the calls' garbage every ``every_s`` seconds, on
    the running loop; called once the worker is ready to serve. Cancel the task to stop."""
    gc.collect()  # start-up's own garbage first: frozen, it would never be freed
    gc.freeze()
    log.debug("froze %d objects loaded at start", gc.get_freeze_count())
    return asyncio.get_running_loop().create_task(_collect_every(every_s), name="heap-collection")


async def _collect_every(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        started = time.perf_counter()
        freed = gc.collect()
        log.debug("full collection: %d objects freed in %.1f ms", freed, 1000.0 * (time.perf_counter() - started))
