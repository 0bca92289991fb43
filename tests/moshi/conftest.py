from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
import torch

from duplex_agent.plugins.contract import DuplexAppendPlan, DuplexFence
from duplex_agent.plugins.engines.frame_batch import FrameBatchEngine
from duplex_agent.plugins.moshi.configs import FRAME_SAMPLES, SAMPLE_RATE
from duplex_agent.plugins.moshi.model import MoshiSpec, load_moshi

# One intra-op thread: the tiny model's steps are small, and with a thread per core beside the
# rest of the suite (or busy loops) every step's parallel region waits on a starved thread, so
# the engine falls far behind real time and its callers hear gaps that are the test machine's.
torch.set_num_threads(1)


def voice_frames(seed: int, count: int) -> list[np.ndarray]:
    """A caller's audio, frame by frame: a gliding tone with noise, different per seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(count * FRAME_SAMPLES) / SAMPLE_RATE
    pitch = 120 + 60 * seed + 40 * np.sin(2 * np.pi * 0.7 * t)
    audio = 0.4 * np.sin(2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE) + 0.02 * rng.standard_normal(t.size)
    audio = audio.astype(np.float32)
    return [audio[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES] for i in range(count)]


def plan(request_id: str, frame: np.ndarray) -> DuplexAppendPlan:
    return DuplexAppendPlan(request_id, 0, DuplexFence(0, 0), {"audio": frame.astype("<f4").tobytes(),
                                                                "sample_rate": SAMPLE_RATE, "units": 1}, False)


class Collector:
    """Reads one request's outputs into a list, in order."""

    def __init__(self, engine: FrameBatchEngine, request_id: str) -> None:
        self.outputs: list = []
        self.task = asyncio.create_task(self._read(engine.outputs(request_id)))

    async def _read(self, outputs) -> None:
        async for out in outputs:
            self.outputs.append(out)

    async def until(self, count: int, timeout: float = 60.0) -> None:
        """Until ``count`` outputs have arrived (the engine's clock thread delivers them to this loop)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.outputs) < count:
            assert loop.time() < deadline, f"{len(self.outputs)} of {count} outputs in {timeout:g} s"
            await asyncio.sleep(0)  # yields to the loop, where delivered outputs land


@pytest.fixture
def tiny_engine() -> Callable[..., FrameBatchEngine]:
    """tiny_engine(capacity) -> a frame engine over the tiny random Moshi, greedy, stepped by hand."""

    def build(capacity: int = 3) -> FrameBatchEngine:
        return FrameBatchEngine(load_moshi(MoshiSpec(config="tiny", device="cpu", greedy=True), capacity=capacity),
                                clocked=False)

    return build
