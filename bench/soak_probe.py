"""What a soak samples from a worker process over time, and the growth read from those samples.

A worker's own /metrics carries its process figures (agent/process_figures: memory, descriptors,
threads, asyncio tasks, livekit FFI handles). A worker without /metrics (the LiveKit Agents app)
is read from outside with psutil: memory, descriptors and threads of its process tree, no tasks.
Growth is the least-squares slope of a figure against the calls that worker has finished, the calls
live at each sample held constant, over the samples after warm-up: per call, not per minute, so a slow machine that runs fewer calls does
not look leakier or tighter than a fast one.
"""

from __future__ import annotations

import contextlib
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

#: The figures sampled, each with its unit; tasks and FFI handles only where /metrics has them.
FIGURES = {"rss_mb": "MB", "fds": "descriptors", "threads": "threads", "tasks": "tasks", "ffi_handles": "handles"}


@dataclass
class Sample:
    t_s: float  # seconds since the soak began
    calls_done: int  # calls this worker had finished by then
    calls_live: int = 0  # calls of its kind live then
    values: dict[str, float] = field(default_factory=dict)
    sessions: float | None = None  # the worker's open sessions, where /metrics says


def from_metrics(port: int) -> tuple[dict[str, float], float | None] | None:
    """The process figures on the worker's /metrics and its open sessions; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values: dict[str, float] = {}
    sessions = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "process_resident_memory_bytes":
                values["rss_mb"] = s.value / 1e6
            elif s.name == "process_open_fds":
                values["fds"] = s.value
            elif s.name == "duplex_process_threads" and s.labels.get("kind") == "all":
                values["threads"] = s.value
            elif s.name == "duplex_asyncio_tasks":
                values["tasks"] = s.value
            elif s.name == "duplex_livekit_ffi_handles":
                values["ffi_handles"] = s.value
            elif s.name == "duplex_sessions_active" and s.labels.get("transport") == "all":
                sessions = s.value
    return values, sessions


def from_process_tree(pid: int) -> dict[str, float]:
    """Memory, descriptors and threads of a process and its children (a job executor may fork)."""
    rss = fds = threads = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
    return {"rss_mb": rss / 1e6, "fds": fds, "threads": threads}


def slope(points: list[tuple[float, float, float]]) -> float | None:
    """Least-squares slope of y on x in points (x, live, y), the live calls held constant: what a
    sample holds for the calls live at that moment (their buffers, tasks, handles) comes and goes
    with them, and a sample taken with fewer live (the last, after every call ended) would read as
    shrinkage. None with too few points or no spread in x."""
    if len(points) < 4:
        return None
    x = np.array([(1.0, p[0], p[1]) for p in points])
    y = np.array([p[2] for p in points])
    if np.ptp(x[:, 1]) == 0:
        return None
    if np.ptp(x[:, 2]) == 0:
        x = x[:, :2]  # the same number live throughout: nothing to hold constant
    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(coefficients[1])


def growth_per_100_calls(samples: list[Sample], figure: str, warmup_s: float) -> tuple[float | None, int]:
    """The figure's growth per 100 finished calls after warm-up, and how many samples it rests on."""
    points = [(float(s.calls_done), float(s.calls_live), s.values[figure]) for s in samples
              if s.t_s >= warmup_s and figure in s.values]
    rate = slope(points)
    return (None if rate is None else 100.0 * rate), len(points)
