"""The engine's own clock: a session whose input is late gets silence and holds no one back."""

from __future__ import annotations

import asyncio

from duplex_agent.plugins.engines.frame_batch import FrameBatchEngine
from duplex_agent.plugins.moshi.model import MoshiSpec, load_moshi
from tests.moshi.conftest import Collector, plan, voice_frames


async def test_a_silent_session_gets_silence_and_the_other_keeps_its_pace():
    engine = FrameBatchEngine(load_moshi(MoshiSpec(config="tiny", device="cpu"), capacity=2))
    try:
        talker_frames = voice_frames(1, 40)
        await engine.submit(plan("talker-e0-in-1", talker_frames[0]))
        await engine.submit(plan("quiet-e0-in-1", voice_frames(2, 1)[0]))  # one frame, then nothing
        talker, quiet = Collector(engine, "talker-e0-in-1"), Collector(engine, "quiet-e0-in-1")
        sent = 1
        deadline = asyncio.get_running_loop().time() + 60
        while len(talker.outputs) < 12:
            assert asyncio.get_running_loop().time() < deadline, f"{len(talker.outputs)} of 12 outputs"
            # Feed the talker one frame per output it gets back, like a caller in real time.
            if sent <= len(talker.outputs) + 1 and sent < len(talker_frames):
                await engine.submit(plan("talker-e0-in-1", talker_frames[sent]))
                sent += 1
            await asyncio.sleep(0.005)
        assert len(quiet.outputs) >= 10  # stepped on every tick all the same, on silence
        assert engine.stats.late_frames >= 10
        assert engine.stats.steps >= 12
    finally:
        await engine.close()
