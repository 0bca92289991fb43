"""The garbage collector in a worker that serves calls for weeks.

Once the model has loaded, what is alive is meant to live as long as the process: the model,
its libraries, the server. ``gc.freeze`` takes all of it out of the collector's scans, so a
full collection (Python's own, now and then, or the one after a call) costs milliseconds, not
the hundreds it takes over a loaded model's heap: a pause every live call's audio would hear.

A finished LiveKit call leaves objects in reference cycles (the SDK's Room with its local
participant, track and event handlers, livekit-agents' job context). Their FFI handles hold
native resources until the objects are collected; collected after each call, those go with
it, instead of waiting for a full collection that a large heap rarely gets.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("duplex_agent.process")


def freeze_what_started() -> None:
    """Once the model has loaded: what is alive now is left out of every later collection."""
    gc.collect()
    gc.freeze()
    log.info("%d objects of the started worker left out of garbage collection", gc.get_freeze_count())


def collect_after_call() -> int:
    """Free what finished calls left in reference cycles; the number of objects freed."""
    started = time.perf_counter()
    freed = gc.collect()
    log.debug("collected %d objects after a call in %.1f ms", freed, 1000.0 * (time.perf_counter() - started))
    return freed
