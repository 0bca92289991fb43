"""What the remote hop adds: the same scripted model, in-process vs. behind our realtime websocket.

Per trial: a 200 ms tone, commit, then the time from the commit to every event of
the reply, once on a local runner (the floor) and once through a RemoteBackend to
our endpoint on loopback (one process, same event loop). Events are matched by kind
and order within the reply (the 3rd ``response.output_audio.delta`` with the 3rd);
the added latency per event is the remote p50 minus the floor's p50 for that event.

Run: python -m bench.remote_hop [trials]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import Counter

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


async def trial(conversation: Conversation) -> dict[str, float]:
    """Each event of one reply, keyed by kind and order (``response.output_audio.delta#3``): ms since the commit."""
    conversation.send(p.InputAudioBufferAppend(TONE))
    committed = time.perf_counter()
    conversation.send(p.InputAudioBufferCommit())
    arrivals: dict[str, float] = {}
    seen: Counter[str] = Counter()
    async for event in conversation.events():
        seen[event.type] += 1
        arrivals[f"{event.type}#{seen[event.type]}"] = 1000 * (time.perf_counter() - committed)
        if isinstance(event, p.ResponseDone):
            assert seen[p.ResponseAudioDelta.type], "a reply without audio"
            return arrivals
    raise RuntimeError("the conversation ended")


async def measure(backend: DuplexBackend, trials: int) -> dict[str, list[float]]:
    """Per event of the reply, its arrival after the commit in every trial (after 5 warm-up ones)."""
    conversation = await backend.open()
    conversation.send(p.SessionUpdate({"turn_detection": None}))
    per_event: dict[str, list[float]] = {}
    for i in range(trials + 5):
        arrivals = await trial(conversation)
        if i >= 5:
            for key, ms in arrivals.items():
                per_event.setdefault(key, []).append(ms)
    await conversation.close()
    return per_event


def first_audio(per_event: dict[str, list[float]]) -> list[float]:
    return per_event[f"{p.ResponseAudioDelta.type}#1"]


async def main(trials: int) -> None:
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="one two three four five", word_delay_s=0))
    local = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    remote = RemoteBackend(str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1))
    await remote.start()
    floor, hop = await measure(local, trials), await measure(remote, trials)
    print(f"scripted model, 5-word reply, {trials} trials each (after 5 warm-up), loopback, one process")
    print(f"  local runner (floor) commit -> first audio delta: {summary(first_audio(floor), 'ms', digits=2)}")
    print(f"  remote hop           commit -> first audio delta: {summary(first_audio(hop), 'ms', digits=2)}")
    print(f"  local runner (floor) commit -> response.done:     {summary(floor['response.done#1'], 'ms', digits=2)}")
    print(f"  remote hop           commit -> response.done:     {summary(hop['response.done#1'], 'ms', digits=2)}")
    shared = [key for key in hop if key in floor]
    added = {key: statistics.median(hop[key]) - statistics.median(floor[key]) for key in shared}
    print(f"  added per event (remote p50 - floor p50), {len(shared)} events of the reply "
          f"(local only: {sorted(set(floor) - set(hop)) or 'none'}; remote only: {sorted(set(hop) - set(floor)) or 'none'}):")
    for key in shared:
        print(f"    {key:<56} floor {statistics.median(floor[key]):6.2f} ms  remote {statistics.median(hop[key]):6.2f} ms"
              f"  added {added[key]:6.2f} ms")
    print(f"  the remote hop adds p50 {statistics.median(added.values()):.2f} ms per event "
          f"(max {max(added.values()):.2f} ms), {added[f'{p.ResponseAudioDelta.type}#1']:.2f} ms to the first audio")
    await remote.close()
    await server.close()
    await local.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
