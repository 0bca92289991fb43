"""What the remote hop adds: the same scripted model, in-process vs. behind our realtime websocket.

Per trial: a 200 ms tone, commit, then time from the commit to the first audio
delta, and to response.done, once on a local runner and once through a
RemoteBackend to our endpoint on loopback (one process, same event loop).

Run: python -m bench.remote_hop [trials]
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
from aiohttp.test_utils import TestServer

from bench.stats import summary
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import Conversation, DuplexBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

TONE = (0.3 * np.sin(np.arange(3200) / 4)).astype(np.float32)


async def trial(conversation: Conversation) -> tuple[float, float]:
    """(commit -> first audio delta, commit -> response.done), in ms."""
    conversation.send(p.InputAudioBufferAppend(TONE))
    committed = time.perf_counter()
    conversation.send(p.InputAudioBufferCommit())
    first = None
    async for event in conversation.events():
        if first is None and isinstance(event, p.ResponseAudioDelta):
            first = time.perf_counter()
        if isinstance(event, p.ResponseDone):
            assert first is not None, "a reply without audio"
            return 1000 * (first - committed), 1000 * (time.perf_counter() - committed)
    raise RuntimeError("the conversation ended")


async def measure(backend: DuplexBackend, trials: int) -> tuple[list[float], list[float]]:
    conversation = await backend.open()
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    firsts, dones = [], []
    for i in range(trials + 5):
        first, done = await trial(conversation)
        if i >= 5:  # warm-up
            firsts.append(first)
            dones.append(done)
    await conversation.close()
    return firsts, dones


async def main(trials: int) -> None:
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="one two three four five", word_delay_s=0))
    local = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    remote = RemoteBackend(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    await remote.start()
    results = {"local runner": await measure(local, trials), "remote hop  ": await measure(remote, trials)}
    print(f"scripted model, 5-word reply, {trials} trials each (after 5 warm-up), loopback, one process")
    for name, (firsts, dones) in results.items():
        print(f"  {name} commit -> first audio delta: {summary(firsts, 'ms', digits=2)}")
        print(f"  {name} commit -> response.done:     {summary(dones, 'ms', digits=2)}")
    local_p50 = float(np.median(results["local runner"][0]))
    remote_p50 = float(np.median(results["remote hop  "][0]))
    print(f"  the remote hop adds {remote_p50 - local_p50:.2f} ms (p50) to the first audio")
    await remote.close()
    await server.close()
    await local.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
