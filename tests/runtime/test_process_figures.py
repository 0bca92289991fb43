"""The worker's process figures on /metrics: what a soak and a dashboard read a leak from."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from duplex_agent.agent import metrics
from duplex_agent.agent.process_figures import watch_loop


def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_memory_descriptors_threads_and_a_watched_loops_tasks_are_on_metrics():
    watch_loop()
    before = samples()[("duplex_asyncio_tasks", ())]
    gate = asyncio.Event()
    waiting = [asyncio.create_task(gate.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    during = samples()
    gate.set()
    await asyncio.gather(*waiting)
    after = samples()[("duplex_asyncio_tasks", ())]
    assert during[("duplex_asyncio_tasks", ())] == before + 3
    assert after == before
    assert during[("process_resident_memory_bytes", ())] > 10e6
    assert during[("process_open_fds", ())] > 0
    assert during[("duplex_process_threads", (("kind", "all"),))] >= during[("duplex_process_threads", (("kind", "python"),))] >= 1


def test_a_closed_loop_counts_no_tasks():
    loop = asyncio.new_event_loop()
    watch_loop(loop)
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    assert samples()[("duplex_asyncio_tasks", ())] >= 0  # read without error, the closed loop skipped


def test_livekit_ffi_handles_are_counted_once_the_sdk_is_loaded():
    import livekit.rtc  # noqa: F401  (the worker's LiveKit path loads it)

    assert samples()[("duplex_livekit_ffi_handles", ())] >= 0
