"""Barge-in in a LiveKit Agents app: LiveKit's adapter with a naive paced DuplexModel vs our DuplexModel.

Same run, same room setup, same caller and interruption clip, same backend (a ``duplex-agent serve``
process with the reference model). Per round and mode, a real livekit SDK caller asks a long
question, lets the reply play for 2.5 s, then talks over it. Figures:
- heard after onset: agent audio the caller still hears from the interruption's first sound to the
  first 500 ms of quiet (wall clock in the caller);
- unheard words in history: words of the long reply in AgentSession's history that the caller
  never heard (Whisper of what it received; a loose measure at the edge of a word).
The floor is the transport's own: an echo job sends the caller's audio straight back, and its
figure is the interruption's first sound going there and back (caller -> SFU -> worker -> SFU).

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_agents_bargein [--rounds 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
from livekit import rtc

from bench.call_rig import free_port
from bench.report import Report
from bench.stats import percentile, summary
from devtools.livekit_server import LoopbackLiveKitServer
from devtools.speech import speak, transcribe, words

REPO = Path(__file__).resolve().parents[1]
AGENT_NAME = "duplex-bargein-bench"  # bench/livekit_agents_app.py's
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family and our two dogs.")
LOUD = 0.02
QUIET_S = 0.5  # longer than the pauses between words inside a reply


class Caller:
    """A real livekit SDK participant: a paced microphone, and every agent frame with its arrival time."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.room = rtc.Room()
        self.source = rtc.AudioSource(48000, 1, queue_size_ms=100)
        self._pending = np.zeros(0, np.float32)
        self._onset_left: int | None = None  # samples until the clip's first sound goes out
        self.onset_at: float | None = None
        self.received: list[tuple[float, np.ndarray]] = []
        self._tasks: list[asyncio.Task] = []

    async def join(self) -> None:
        self.room.on("track_subscribed",
                     lambda track, *_: self._tasks.append(asyncio.ensure_future(self._listen(track))))
        await self.room.connect(self.url, self.token)
        await self.room.local_participant.publish_track(
            rtc.LocalAudioTrack.create_audio_track("mic", self.source),
            rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
        self._tasks.append(asyncio.ensure_future(self._feed()))

    def say(self, audio: np.ndarray, *, mark_onset: bool = False) -> None:
        if mark_onset:
            self.onset_at = None
            self._onset_left = self._pending.size + int(np.argmax(np.abs(audio) > LOUD))
        self._pending = np.concatenate([self._pending, audio.astype(np.float32)])

    @property
    def busy(self) -> bool:
        return self._pending.size > 0

    async def _feed(self) -> None:
        while True:
            chunk, self._pending = self._pending[:960], self._pending[960:]
            pcm = np.zeros(960, np.int16)
            pcm[: chunk.size] = (np.clip(chunk, -1, 1) * 32767).astype(np.int16)
            await self.source.capture_frame(rtc.AudioFrame(pcm.tobytes(), 48000, 1, 960))
            if self._onset_left is not None:
                if self._onset_left < 960:
                    self.onset_at = time.monotonic()
                    self._onset_left = None
                else:
                    self._onset_left -= 960

    async def _listen(self, track: rtc.Track) -> None:
        async for event in rtc.AudioStream(track, sample_rate=48000, num_channels=1):
            samples = np.frombuffer(event.frame.data, np.int16).astype(np.float32) / 32768.0
            self.received.append((time.monotonic(), samples))

    def loud_since(self, since: float) -> float:
        """Seconds of loud agent audio received since ``since``."""
        return sum(s.size / 48000 for t, s in self.received if t >= since and _rms(s) > LOUD)

    def quiet_from(self, since: float) -> float | None:
        """When the first QUIET_S of quiet after ``since`` began."""
        start = None
        for t, s in self.received:
            if t < since:
                continue
            if _rms(s) > LOUD:
                start = None
            elif start is None:
                start = t
            elif t - start >= QUIET_S:
                return start
        return None

    def audio(self, start: float, end: float) -> np.ndarray:
        parts = [s for t, s in self.received if start <= t <= end]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def leave(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.room.disconnect()


def _rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _records(path: Path, room: str) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["room"] == room]


async def one_round(server: LoopbackLiveKitServer, record: Path, mode: str, room: str,
                    question: np.ndarray, interruption: np.ndarray) -> dict:
    caller = Caller(server.url, server.mint_token(f"caller-{room}", room))
    await caller.join()
    try:
        await server.create_dispatch(room, AGENT_NAME, metadata=mode)
        await _until(lambda: any(r["kind"] == "started" for r in _records(record, room)), 60, "the job")
        if mode == "echo":
            # both ways up: the echo has the caller's audio, and the caller its echo (of the mic's silence)
            await _until(lambda: any(r["kind"] == "echoing" for r in _records(record, room)), 60, "the echo")
            echoed_from = len(caller.received)
            await _until(lambda: len(caller.received) > echoed_from + 10, 60, "the echo's track")
            caller.say(interruption, mark_onset=True)
            await _until(lambda: caller.onset_at is not None and any(
                t > caller.onset_at and _rms(s) > LOUD for t, s in caller.received), 20, "the echo")
            first = next(t for t, s in caller.received if t > caller.onset_at and _rms(s) > LOUD)
            return {"heard_ms": 1000.0 * (first - caller.onset_at)}
        caller.say(question)
        await _until(lambda: not caller.busy, 60, "the question")
        asked = time.monotonic()
        await _until(lambda: caller.loud_since(asked) >= 2.5, 120, "2.5 s of the reply")
        caller.say(interruption, mark_onset=True)
        await _until(lambda: caller.onset_at is not None and caller.quiet_from(caller.onset_at) is not None, 60,
                     "quiet after the interruption")
        quiet = caller.quiet_from(caller.onset_at)
        heard = set(words(transcribe(caller.audio(asked, quiet), 48000)))
        await asyncio.sleep(8.0)  # the history settles, the reply to the interruption included
        long_words = set(words(LONG))
        kept: set[str] = set()
        for r in _records(record, room):
            if r["kind"] == "item" and r["role"] == "assistant":
                kept |= set(words(r["text"])) & long_words
        return {"heard_ms": 1000.0 * (quiet - caller.onset_at), "unheard_words": len(kept - heard)}
    finally:
        await caller.leave()


async def main(rounds: int, report: Report) -> None:
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-barge-in-bench")
    await server.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    logs = Path(tempfile.mkdtemp(prefix="lk-bargein-"))
    record = logs / "record.jsonl"
    serve = subprocess.Popen([sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--host", "127.0.0.1",
                              "--port", str(port), "--plugin", "reference", "--max-sessions", "8"],
                             cwd=REPO, env=env, stdout=(logs / "serve.log").open("w"), stderr=subprocess.STDOUT)
    worker = None
    try:
        async with aiohttp.ClientSession() as http:
            async def up() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False
            while not await up():
                await asyncio.sleep(0.2)
        worker = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "livekit_agents_app.py"), "start"], cwd=REPO,
            env={**env, "LIVEKIT_URL": server.url, "LIVEKIT_API_KEY": server.api_key,
                 "LIVEKIT_API_SECRET": server.api_secret, "PYTHONPATH": str(REPO),
                 "BENCH_BACKEND_URL": f"ws://127.0.0.1:{port}/v1/realtime?duplex=1", "BENCH_RECORD": str(record)},
            stdout=(logs / "worker.log").open("w"), stderr=subprocess.STDOUT)
        await server.wait_for_worker(AGENT_NAME, available=True, timeout=120)
        question = speak(LONG, 48000, before_ms=300, after_ms=1200)
        interruption = speak("Wait, stop please.", 48000)
        results: dict[str, list[dict]] = {"echo": [], "naive": [], "ours": []}
        for n in range(rounds):
            for mode in results:
                try:
                    results[mode].append(await one_round(server, record, mode, f"{mode}-{n}", question, interruption))
                except TimeoutError as exc:
                    print(f"  round {n} {mode}: {exc} (left out)", flush=True)
                else:
                    print(f"  round {n} {mode}: {results[mode][-1]}", flush=True)
        floor = [r["heard_ms"] for r in results["echo"]]
        print(f"transport floor (echo, onset there and back): {summary(floor, 'ms')}")
        for mode, label in (("naive", "LiveKit's adapter, naive paced DuplexModel"), ("ours", "our DuplexModel")):
            heard = [r["heard_ms"] for r in results[mode]]
            unheard = [r["unheard_words"] for r in results[mode]]
            print(f"{label}: heard after onset {summary(heard, 'ms')}; unheard words in history "
                  f"{summary(unheard, 'words', digits=0)}")
            if heard and floor:
                print(f"  beyond the floor: p50 {statistics.median(heard) - statistics.median(floor):+.0f} ms, "
                      f"p95 {percentile(heard, 95) - percentile(floor, 95):+.0f} ms")
            who = "our DuplexModel" if mode == "ours" else "LiveKit's adapter around a naive paced DuplexModel"
            report.add(f"livekit_agents.bargein_heard_p50{'' if mode == 'ours' else '.naive_adapter'}",
                       f"LiveKit Agents app, {who}: agent audio heard after the caller's interruption began, p50; "
                       "floor: an echo job's round trip through the SFU", percentile(heard, 50),
                       floor=percentile(floor, 50), unit="ms", n=len(heard), area="barge-in")
            report.add(f"livekit_agents.unheard_words{'' if mode == 'ours' else '.naive_adapter'}",
                       f"LiveKit Agents app, {who}: words in the session's history the caller never heard, p50",
                       percentile(unheard, 50), unit="words", n=len(unheard), area="barge-in")
        report.write()
        print(f"(logs in {logs})")
    finally:
        for process in (worker, serve):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
        await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    asyncio.run(main(3 if args.quick else args.rounds, Report("livekit_agents_bargein", quick=args.quick)))
