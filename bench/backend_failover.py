"""The gap a caller hears when its backend dies or freezes: a question asked just after.

Per trial, three real processes: two backends (our endpoint with the scripted model,
60 words generated 50 ms apart) and a front ``duplex-agent serve --backend A --backend B``;
a realtime-websocket caller on the front. The caller asks a normal question (the
floor: end of question -> first audio of its answer), then a second one; the backend
holding the call is SIGKILLed at the first audio of that answer (odd trials: still
generating) or once it is fully generated (even trials), and the caller asks again at
once. The gap is end of that question (its commit sent) -> first audio of its answer,
minus the same run's normal turn.

Then as many trials where the backend is frozen instead (SIGSTOP at the first audio of the
answer: no reset, its sockets stay open, as a powered-off or partitioned host's would): the
time from the freeze to the caller being told the playing reply failed (the call starts
moving), beside the same from a kill while generating (the host's reset tells at once), and
the gap of the question asked at the freeze.

Run: python -m bench.backend_failover [trials] [--quick]   (default 5 of each; quick: 2)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from bench.call_rig import free_port
from bench.report import Report
from bench.stats import spread

REPO = Path(__file__).resolve().parents[1]
WORDS = " ".join(f"word{i}" for i in range(60))
QUESTION = (0.3 * np.sin(np.arange(4800) / 4)).astype(np.float32)  # 300 ms at 16 kHz
TIMEOUT_S = 60.0


async def serve_backend(port: int) -> None:
    """``--backend-process PORT``: our endpoint with the slow scripted model (this file, run as a process)."""
    from aiohttp import web

    from duplex_agent.agent.app.server import build_app
    from duplex_agent.agent.app.settings import Settings
    from duplex_agent.agent.protocol.audio import as_float32_audio
    from duplex_agent.agent.session.local_backend import LocalBackend
    from duplex_agent.plugins.scripted import Script, ScriptedPlugin

    plugin = ScriptedPlugin(as_float32_audio, Script(reply=WORDS, word_delay_s=0.05))
    backend = LocalBackend(plugin, plugin.build_local_engine())
    runner = web.AppRunner(build_app(backend, Settings(), with_webrtc=False))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


class Process:
    def __init__(self, args: list[str]) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
        env["HF_HUB_OFFLINE"] = "1"
        self.process = subprocess.Popen([sys.executable, *[a.replace("{port}", str(self.port)) for a in args]],
                                        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1"

    async def health(self) -> dict | None:
        try:
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{self.port}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                return await r.json()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def ready(self) -> None:
        deadline = time.monotonic() + 120
        while await self.health() is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.process.args} did not come up")
            await asyncio.sleep(0.1)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class Caller:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def recv(self) -> dict:
        message = await self.ws.receive(timeout=TIMEOUT_S)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"the front closed the call ({message.type.name})")
        return json.loads(message.data)

    async def ask(self) -> float:
        """Send a question; the time its end (the commit) went out."""
        pcm = (np.clip(QUESTION, -1, 1) * 32767).astype("<i2")
        for i in range(0, pcm.size, 320):
            await self.ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                               "audio": base64.b64encode(pcm[i:i + 320].tobytes()).decode()}))
        await self.ws.send_str('{"type":"input_audio_buffer.commit"}')
        return time.perf_counter()

    async def first_audio(self, *, not_of: set[str]) -> tuple[float, str]:
        """(when, response) of the next audio delta of a response not in ``not_of``."""
        while True:
            event = await self.recv()
            if event["type"] == "error" or event["type"] == "session.closed":
                raise RuntimeError(f"the caller got {event}")
            if event["type"] == "response.output_audio.delta" and event["response_id"] not in not_of:
                return time.perf_counter(), event["response_id"]

    async def done(self, response_id: str) -> str:
        """Wait for ``response_id``'s end; its status."""
        while (event := await self.recv())["type"] != "response.done" or event["response_id"] != response_id:
            pass
        return event["response"]["status"]


async def holder(a: Process, b: Process) -> Process:
    for _ in range(200):
        for backend in (a, b):
            if ((await backend.health()) or {}).get("sessions") == 1:
                return backend
        await asyncio.sleep(0.05)
    raise RuntimeError("no backend holds the call")


@dataclass
class Trial:
    normal_ms: float
    #: End of the question asked at the kill or freeze -> first audio of its answer.
    after_ms: float
    #: The kill or freeze -> the caller told the playing reply failed (None: it had finished).
    moved_ms: float | None


async def trial(n: int, *, freeze: bool = False) -> Trial:
    """One call; its backend killed (or, with ``freeze``, stopped with SIGSTOP) mid-call."""
    backends = [Process(["-m", "bench.backend_failover", "--backend-process", "{port}"]) for _ in range(2)]
    front = None
    try:
        for backend in backends:
            await backend.ready()
        front = Process(["-m", "duplex_agent.agent.app.cli", "serve", "--host", "127.0.0.1", "--port", "{port}",
                         *[arg for b in backends for arg in ("--backend", b.url)],
                         "--backend-connect-timeout", "1", "--drain-timeout", "1"])
        await front.ready()
        async with aiohttp.ClientSession() as http, http.ws_connect(front.url, max_msg_size=64 << 20) as ws:
            caller = Caller(ws)
            await ws.send_str(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            while (await caller.recv())["type"] != "session.created":
                pass
            asked = await caller.ask()
            heard, normal_reply = await caller.first_audio(not_of=set())
            normal_ms = 1000 * (heard - asked)
            await caller.done(normal_reply)
            await ws.send_str(json.dumps({"type": "playback.ack", "response_id": normal_reply, "played_ms": 1e6}))
            await caller.ask()
            _, doomed = await caller.first_audio(not_of={normal_reply})
            generating = freeze or n % 2 == 1  # even kill trials: once the answer is fully generated
            if not generating:
                await caller.done(doomed)
            lost = await holder(*backends)
            struck = time.perf_counter()
            if freeze:
                lost.process.send_signal(signal.SIGSTOP)
            else:
                lost.stop(signal.SIGKILL)
            asked = await caller.ask()
            moved_ms = None
            if generating:
                status = await caller.done(doomed)
                moved_ms = 1000 * (time.perf_counter() - struck) if status == "failed" else None
            heard, _ = await caller.first_audio(not_of={normal_reply, doomed})
            return Trial(normal_ms, 1000 * (heard - asked), moved_ms)
    finally:
        if front is not None:
            front.stop()
        for backend in backends:
            backend.process.send_signal(signal.SIGCONT)  # a frozen one must run to take its SIGTERM
            backend.stop()


async def main(trials: int, quick: bool = False) -> None:
    report = Report("backend_failover", quick=quick)
    normals, afters, killed_moves = [], [], []
    for n in range(1, trials + 1):
        done = await trial(n)
        normals.append(done.normal_ms)
        afters.append(done.after_ms)
        if done.moved_ms is not None:
            killed_moves.append(done.moved_ms)
        print(f"  trial {n} ({'killed while generating' if n % 2 else 'killed after generating'}): "
              f"normal turn {done.normal_ms:.0f} ms, turn after the kill {done.after_ms:.0f} ms", flush=True)
    gaps = [after - normal for after, normal in zip(afters, normals, strict=True)]
    print(f"backend killed mid-call, {trials} trials (two scripted backends behind a front serve, loopback):")
    print(f"  normal turn (end of question -> first audio):      {spread(normals)}")
    print(f"  question just after the kill -> first audio:       {spread(afters)}")
    print(f"  gap (after the kill minus the same run's normal):  p50 {statistics.median(gaps):.0f} ms, "
          f"max {max(gaps):.0f} ms")
    # The floor is a normal turn of the same call: what the caller waits for anyway.
    title = "a question asked just after the call's GPU host died, end of question -> first audio"
    report.add("failover.gap_p50", f"{title}, p50; floor: a normal turn", statistics.median(afters),
               floor=statistics.median(normals), unit="ms", n=trials, area="backends")
    report.add("failover.gap_max", f"{title}, the slowest; floor: the slowest normal turn", max(afters),
               floor=max(normals), unit="ms", n=trials, area="backends")
    await frozen_trials(report, trials, killed_moves)
    report.write()


async def frozen_trials(report: Report, trials: int, killed_moves: list[float]) -> None:
    """The same call with its backend frozen (SIGSTOP) mid-reply instead of killed."""
    moves, normals, afters = [], [], []
    for n in range(1, trials + 1):
        done = await trial(n, freeze=True)
        if done.moved_ms is None:
            raise RuntimeError("the frozen host's reply was not ended failed: the call never moved")
        moves.append(done.moved_ms)
        normals.append(done.normal_ms)
        afters.append(done.after_ms)
        print(f"  frozen trial {n}: told the reply failed {done.moved_ms:.0f} ms after the freeze, "
              f"normal turn {done.normal_ms:.0f} ms, turn after the freeze {done.after_ms:.0f} ms", flush=True)
    floor_p50 = statistics.median(killed_moves) if killed_moves else None
    floor_max = max(killed_moves) if killed_moves else None
    print(f"backend frozen mid-reply (SIGSTOP, no reset), {trials} trials:")
    print(f"  freeze -> caller told the reply failed (the move starts): {spread(moves)}")
    print(f"    floor, the same after a kill (a reset):                 "
          f"{spread(killed_moves) if killed_moves else 'n/a'}")
    print(f"  question asked at the freeze -> first audio:              {spread(afters)}")
    title = "the call's GPU host froze mid-reply (no reset): freeze -> the caller told the reply failed (the move starts)"
    report.add("failover.frozen_moved_p50", f"{title}, p50; floor: the same after a kill", statistics.median(moves),
               floor=floor_p50, unit="ms", n=trials, area="backends")
    report.add("failover.frozen_moved_max", f"{title}, the slowest; floor: the slowest after a kill", max(moves),
               floor=floor_max, unit="ms", n=trials, area="backends")
    report.add("failover.frozen_gap_p50", "a question asked as the call's GPU host froze, end of question -> first "
               "audio, p50; floor: a normal turn", statistics.median(afters), floor=statistics.median(normals),
               unit="ms", n=trials, area="backends")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--backend-process"]:
        asyncio.run(serve_backend(int(sys.argv[2])))
    else:
        quick = "--quick" in sys.argv[1:]
        counts = [a for a in sys.argv[1:] if a != "--quick"]
        asyncio.run(main(int(counts[0]) if counts else (2 if quick else 5), quick))
