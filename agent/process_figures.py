"""The worker process's own figures on /metrics: memory, descriptors, threads, asyncio tasks and
livekit FFI handles, so that a leak shows on the dashboard a worker is already scraped into, in the
same units a soak reads, without a debugger attached.

Memory and descriptors are prometheus_client's standard ``process_*`` families; the rest are ours:
threads (Python's and native ones, such as livekit's and onnxruntime's), tasks on each event loop
the worker runs calls on (the main loop, and each LiveKit job's), and the livekit SDK's live FFI
handles (a room, a track or a stream the SDK never released holds one).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import weakref

from prometheus_client.core import GaugeMetricFamily

_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_lock = threading.Lock()


def watch_loop(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Count this loop's tasks on /metrics for as long as it lives (a closed loop counts none)."""
    loop = loop or asyncio.get_running_loop()
    with _lock:
        _loops.add(loop)


def asyncio_tasks() -> int:
    """Unfinished tasks on the watched loops. Read from the metrics thread, a loop's task set may
    change under the read; asyncio.all_tasks retries that itself."""
    with _lock:
        loops = list(_loops)
    total = 0
    for loop in loops:
        if loop.is_closed():
            continue
        try:
            total += len(asyncio.all_tasks(loop))
        except RuntimeError:  # still changing after asyncio's own retries: skip this loop this time
            continue
    return total


def os_threads() -> int:
    """Every thread of the process, native ones included (Linux); Python's own count elsewhere."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def livekit_ffi_handles() -> int | None:
    """The livekit SDK's live FFI handles, or None when the SDK is not loaded (a direct-only worker)."""
    ffi = sys.modules.get("livekit.rtc._ffi_client")
    handles = getattr(ffi, "_live_handles", None)
    return None if handles is None else len(handles)


class ProcessFigures:
    """A prometheus collector: read when /metrics is rendered, so nothing costs a call anything."""

    def collect(self):
        threads = GaugeMetricFamily("duplex_process_threads", "Threads of the worker process, by kind: python "
                                    "(threading's) and all (native ones included)", labels=["kind"])
        threads.add_metric(["python"], threading.active_count())
        threads.add_metric(["all"], os_threads())
        yield threads
        yield GaugeMetricFamily("duplex_asyncio_tasks", "Unfinished asyncio tasks on the loops calls run on "
                                "(the main loop and each LiveKit job's)", value=asyncio_tasks())
        handles = livekit_ffi_handles()
        if handles is not None:
            yield GaugeMetricFamily("duplex_livekit_ffi_handles", "The livekit SDK's FFI handle objects still "
                                    "alive (rooms, participants, tracks, publications, streams, sources); one whose "
                                    "native side was released counts until its owner is collected", value=handles)
