"""The runner's overhead per append with a no-op engine, how late silence-continuation
units reach the model behind their deadlines, and events/s over the websocket.

Run: python -m bench.runtime_overhead [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterable

import aiohttp
import numpy as np
from aiohttp.test_utils import TestServer

from bench.stats import summary
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.contract import DuplexAppendPlan
from duplex_agent.plugins.contract.engine import DuplexEngine, StageOutput
from duplex_agent.plugins.scripted import Script, ScriptedPlugin


class NoopEngine(DuplexEngine):
    """Takes every plan and does nothing; notes when each arrived."""

    def __init__(self) -> None:
        self.arrived: asyncio.Queue[float] = asyncio.Queue()

    @property
    def stage_count(self) -> int:
        return 1

    async def submit(self, plan: DuplexAppendPlan) -> None:
        self.arrived.put_nowait(time.perf_counter())

    async def outputs(self, request_id: str) -> AsyncIterator[StageOutput]:
        return
        yield

    async def abort(self, request_ids: Iterable[str]) -> None:
        return None


async def append_overhead(n: int = 2000) -> list[float]:
    engine = NoopEngine()
    plugin = ScriptedPlugin(as_float32_audio, Script(unit_samples=320))
    backend = LocalBackend(plugin, engine)
    runner = await backend.open()
    runner.send(p.SessionUpdate({"turn_detection": None, "input_sample_rate": 16000}))
    frame = (np.random.default_rng(0).standard_normal(320) * 0.1).astype(np.float32)
    samples = []
    for i in range(n + 100):
        sent = time.perf_counter()
        runner.send(p.InputAudioBufferAppend(frame))
        arrived = await engine.arrived.get()
        if i >= 100:  # warm-up
            samples.append((arrived - sent) * 1e6)
    await backend.close()
    return samples


async def silence_lag(units: int = 200) -> tuple[list[float], int]:
    """A continuous model fed one loud unit, then silence: each unit's lag behind its deadline (ms)."""
    script = Script(input_mode="continuous", unit_samples=320, silence_continuation_samples=320)
    plugin = ScriptedPlugin(as_float32_audio, script)
    backend = LocalBackend(plugin, plugin.build_local_engine())
    runner = await backend.open()
    runner.send(p.SessionUpdate({"turn_detection": None}))
    runner.send(p.InputAudioBufferAppend(np.full(320, 0.3, np.float32)))
    while sum(deadline is not None for _, _, deadline in script.unit_log) < units:
        await asyncio.sleep(0.05)
    lags = [(arrived - deadline) * 1000 for arrived, _, deadline in script.unit_log if deadline is not None]
    skipped = runner.skipped_silence_units
    await backend.close()
    return lags[:units], skipped


async def websocket_events_per_second(words: int = 3000) -> tuple[float, int]:
    plugin = ScriptedPlugin(as_float32_audio, Script(reply=" ".join(["word"] * words), word_ms=20))
    backend = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(backend, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        tone = base64.b64encode((np.ones(3200) * 3000).astype("<i2").tobytes()).decode()
        await ws.send_str(json.dumps({"type": "input_audio_buffer.append", "audio": tone}))
        await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
        count, start = 0, None
        async for message in ws:
            event = json.loads(message.data)
            if event["type"] == "response.created":
                start = time.perf_counter()
            count += start is not None
            if event["type"] == "response.done":
                break
        elapsed = time.perf_counter() - start
    await server.close()
    await backend.close()
    return count / elapsed, count


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    quick = parser.parse_args().quick
    overhead = await append_overhead(500 if quick else 2000)
    print("runner overhead per append (send -> engine submit, no-op engine, 20 ms float32 frames):")
    print("  " + summary(overhead, "us"))
    lags, skipped = await silence_lag(50 if quick else 200)
    print("silence continuation, 20 ms units: arrival at the model behind each unit's deadline:")
    print(f"  {summary(lags, 'ms', digits=2)}; units skipped because the loop was late: {skipped}")
    rate, count = await websocket_events_per_second(1000 if quick else 3000)
    print(f"events through the realtime websocket: {rate:,.0f} events/s ({count} events, one client, loopback)")


if __name__ == "__main__":
    asyncio.run(main())
