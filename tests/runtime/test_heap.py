"""The worker's heap keeping, on a virtual clock: start-up's garbage is freed and the rest frozen
when the worker is ready, and garbage a call leaves in reference cycles is freed on the beat, not
whenever CPython gets to a full collection."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from duplex_agent.agent.app.heap import keep_the_heap
from tests.support.virtual_time import run_virtual


class _Cycle:
    """An object in a reference cycle: only a full collection frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def automatic_collection_off():
    """Only the heap keeping collects here; the process's own objects are unfrozen afterwards."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()


def test_start_ups_garbage_is_freed_before_what_it_loaded_is_frozen(automatic_collection_off):
    freed: list[str] = []
    loaded = _Cycle()
    weakref.finalize(_Cycle(), freed.append, "start-up's garbage")

    async def main() -> None:
        before = gc.get_freeze_count()
        heap = keep_the_heap(every_s=15.0)
        try:
            assert freed == ["start-up's garbage"]
            assert gc.get_freeze_count() > before
            assert not any(loaded is o for o in gc.get_objects())  # frozen objects are out of every collection
        finally:
            heap.cancel()

    run_virtual(main())


def test_a_calls_cycles_are_freed_on_the_next_beat(automatic_collection_off):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        heap = keep_the_heap(every_s=15.0)
        try:
            freed = asyncio.Event()
            started = loop.time()
            # A call's cycle made between two beats (a step of the virtual clock, not a wait on
            # quiet): it is freed at the next beat, not when it was made.
            await asyncio.sleep(1.0)
            weakref.finalize(_Cycle(), freed.set)
            await asyncio.wait_for(freed.wait(), 60.0)
            assert loop.time() - started == pytest.approx(15.0)
            # and again on each later beat
            freed.clear()
            weakref.finalize(_Cycle(), freed.set)
            await asyncio.wait_for(freed.wait(), 60.0)
            assert loop.time() - started == pytest.approx(30.0)
        finally:
            heap.cancel()

    run_virtual(main())
