"""Turn latency as the caller hears it, beside a bare aiortc echo peer's round trip.

An aiortc caller (this process) calls the worker (``duplex-agent serve``, reference
model, echo responder, in a process of its own) over direct WebRTC and speaks
utterances in an espeak-ng voice the tests do not use: finished sentences, and
sentences with a 300-400 ms pause in the middle. For each it measures, on its own
side, from the frame holding the last speech sample leaving it to the first loud
frame of the reply reaching it. Each utterance is said twice in the call, with the
end-of-turn model off and on in alternating order (``turn_detection.end_of_turn``, sent
over the data channel), so both modes meet the same load. A mid-sentence pause that commits the turn before the sentence is over
is a false cut-in.

In the same run, the caller calls a bare aiortc echo peer (another process) that
sends back what it receives: first loud sample sent -> first loud frame heard is
the transport floor of this client (Opus both ways, RTP, the receive jitter buffer).

Prints both, the difference, and the false cut-in rates; never passes or fails.

Run: python -m bench.caller_turn_latency [--quick] [--voice en-gb-x-rp+m3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection

from bench.call_rig import free_port
from bench.report import Report
from bench.stats import percentile
from bench.webrtc_callers import offer_and_connect
from devtools.caller_peer import CallerPeer, Mic
from devtools.speech import espeak, pause_inside, speak
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from duplex_agent.webrtc.direct.tracks import PlayoutTrack

RATE = 48000
GOAL_MS = 400.0  # caller-heard p50 minus the echo floor, finished sentences

FINISHED = [
    "What time does the train leave tomorrow?",
    "I need a taxi to the station.",
    "Can you read me the news?",
    "My flight was cancelled this morning.",
    "How much does the blue jacket cost?",
    "Please remind me to call my sister.",
    "Where is the nearest pharmacy?",
    "The printer on the second floor is broken.",
    "Is it going to rain this weekend?",
    "I would like two tickets for the concert.",
    "Tell me something interesting about whales.",
    "We are out of milk and bread.",
]
#: (before the pause, after it)
PAUSED = [
    ("I want to book a room for", "three nights in June."),
    ("Could you turn the music", "down a little?"),
    ("The package should arrive at", "my office on Monday."),
    ("Can you find me a recipe with", "chicken and rice?"),
    ("I was thinking that we could", "meet for lunch on Friday."),
    ("Please send the invoice to", "the accounting team."),
    ("What is the fastest way to", "get to the museum?"),
    ("My daughter is starting school in", "September."),
]


@dataclass
class Utterance:
    text: str
    audio: np.ndarray  # 48 kHz float32
    paused: bool
    pause_ms: float = 0.0


@dataclass
class Said:
    utterance: Utterance
    started_at: float = 0.0
    last_sent_at: float | None = None  # the frame holding the last speech sample left the caller
    heard_at: float | None = None  # the first loud frame of the reply reached the caller
    commits_before_end: int = 0  # turns committed while the sentence was still going on
    worker_turn_ms: float | None = None  # the worker's own turn_ms figure for this turn


class Caller(CallerPeer):
    """One aiortc call from the caller's ``Mic``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.mic = Mic()
        super().__init__(PlayoutTrack(self.mic.next_frame))

    async def connect(self, http: aiohttp.ClientSession, url: str) -> None:
        await offer_and_connect(self.pc, self.address, http, url)
        if not await self.until(lambda: self.channel.readyState == "open", 10):
            raise RuntimeError("the data channel did not open")


# ---- the echo peer (its own process) ----


async def serve_echo(port: int, address: str) -> None:
    from aiohttp import web
    from aiortc import MediaStreamTrack, RTCSessionDescription

    from duplex_agent.webrtc.direct.host_address import candidates_on
    from duplex_agent.webrtc.direct.ice_consent import keep_consent

    peers: set[RTCPeerConnection] = set()

    class Echo(MediaStreamTrack):
        kind = "audio"

        def __init__(self, source: MediaStreamTrack) -> None:
            super().__init__()
            self._source = source

        async def recv(self):  # noqa: ANN201
            return await self._source.recv()

    async def offer(request: web.Request) -> web.Response:
        params = await request.json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        peers.add(pc)
        pc.on("track", lambda track: pc.addTrack(Echo(track)))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=params["sdp"], type=params["type"]))
        keep_consent(pc)  # the worker's consent, so that the floor rides out the same stalls
        with candidates_on(address):
            await pc.setLocalDescription(await pc.createAnswer())
        return web.json_response({"sdp": pc.localDescription.sdp, "type": pc.localDescription.type})

    app = web.Application()
    app.router.add_post("/api/offer", offer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin
    await asyncio.gather(*(pc.close() for pc in peers))
    await runner.cleanup()


async def echo_round_trips(url: str, address: str, clips: list[np.ndarray]) -> list[float]:
    caller = Caller(address)
    async with aiohttp.ClientSession() as http:
        await caller.connect(http, url)
    trips = []
    try:
        for clip in clips:
            heard_before = len(caller.loud_at)
            caller.mic.say(np.concatenate([np.zeros(RATE // 5, np.float32), clip]))
            await caller.until(lambda: not caller.mic.busy, 30)
            if await caller.until(lambda: len(caller.loud_at) > heard_before, 5):  # noqa: B023 (called within this iteration)
                sent = caller.mic.first_loud_sent_at
                if sent is not None:
                    trips.append(1000.0 * (caller.loud_at[heard_before] - sent))
            await caller.until(lambda: False, 0.3)  # let the echo's tail pass
    finally:
        await caller.close()
    return trips


# ---- the worker's turns ----


async def speak_turns(url: str, address: str, utterances: list[Utterance]) -> dict[bool, list[Said]]:
    """Each utterance twice in one call, the end-of-turn model off and on, in alternating
    order (A/B under the same load); the page's session.update switches the model."""
    caller = Caller(address)
    async with aiohttp.ClientSession() as http:
        await caller.connect(http, url)
    said: dict[bool, list[Said]] = {False: [], True: []}
    mode: bool | None = None
    try:
        for i, utterance in enumerate(utterances):
            for end_of_turn in ((False, True) if i % 2 == 0 else (True, False)):
                if end_of_turn != mode:
                    mark = len(caller.events)
                    caller.send({"type": "session.update", "session": {"turn_detection": {
                        "type": "server_vad", "end_of_turn": end_of_turn}}})
                    if not await caller.until(
                            lambda: any(e["type"] == "session.updated" for _, e in caller.events[mark:]), 10):  # noqa: B023 (called within this iteration)
                        raise RuntimeError("the worker did not confirm session.update")
                    mode = end_of_turn
                said[end_of_turn].append(await say_one(caller, utterance))
    finally:
        await caller.close()
    return said


async def say_one(caller: Caller, utterance: Utterance) -> Said:
    record = Said(utterance, started_at=time.perf_counter())
    events_before, heard_before = len(caller.events), len(caller.loud_at)
    caller.mic.say(np.concatenate([np.zeros(RATE // 5, np.float32), utterance.audio]))
    await caller.until(lambda: caller.mic.last_speech_sent_at is not None, 30)
    record.last_sent_at = caller.mic.last_speech_sent_at or time.perf_counter()
    record.commits_before_end = sum(1 for at, e in caller.events[events_before:]
                                    if e["type"] == "input_audio_buffer.committed" and at < record.last_sent_at)
    reply = lambda: [t for t in caller.loud_at[heard_before:] if t > record.last_sent_at]  # noqa: E731
    if await caller.until(lambda: bool(reply()), 10):
        record.heard_at = reply()[0]
        # Next utterance once the agent has finished speaking and gone back to listening.
        done_from = len(caller.events)
        await caller.until(lambda: any(e["type"] == "agent.state" and e.get("state") == "listening"
                                       for _, e in caller.events[done_from:]), 20)
        # The worker's own figure for this turn, from its next metrics message.
        metrics_from = len(caller.events)
        if await caller.until(lambda: any(e["type"] == "metrics" for _, e in caller.events[metrics_from:]), 3):
            metrics = [e for _, e in caller.events[metrics_from:] if e["type"] == "metrics"][-1]
            record.worker_turn_ms = metrics["latency"]["turn_ms"]["last"]
    quiet_from = len(caller.loud_at)
    await caller.until(lambda: len(caller.loud_at) > quiet_from, 0.4)  # a gap between turns
    return record


# ---- setup and report ----


async def wait_http(url: str, path: str, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url + path) as response:
                    if response.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")
            await asyncio.sleep(0.25)


def build_utterances(voice: str, finished: int, paused: int, seed: int) -> list[Utterance]:
    rng = random.Random(seed)

    def say(text: str) -> np.ndarray:
        return speak(text, RATE) if voice == "piper" else espeak(text, RATE, voice=voice)

    out = [Utterance(text, say(text), False) for text in FINISHED[:finished]]
    for before, after in PAUSED[:paused]:
        text = f"{before} {after}"
        pause_ms = rng.uniform(300, 400)
        audio = pause_inside(say(text), RATE, len(before) / len(text), pause_ms)
        out.append(Utterance(text, audio, True, pause_ms))
    rng.shuffle(out)
    return out


def fmt(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50 {statistics.median(values):6.0f} ms  p95 {percentile(values, 95):6.0f} ms  (n={len(values)})"


@dataclass(frozen=True)
class ModeFigures:
    """One end-of-turn mode's turns, as the caller heard them, against the echo floor."""

    finished_ms: list[float]  # finished sentences: last speech sent -> first loud reply frame heard
    beyond_floor_p50_ms: float  # their p50 less the echo floor's (the goal: GOAL_MS)
    cut_ins: int  # paused sentences whose turn was committed before the sentence was over
    paused: int
    unanswered: int
    worker_turn_ms: list[float]  # the worker's own turn_ms for the finished sentences


def mode_figures(said: list[Said], floor_ms: float) -> ModeFigures:
    finished = [1000.0 * (s.heard_at - s.last_sent_at) for s in said
                if not s.utterance.paused and s.heard_at and s.last_sent_at]
    paused = [s for s in said if s.utterance.paused]
    beyond = (statistics.median(finished) if finished else float("nan")) - floor_ms
    return ModeFigures(
        finished_ms=finished, beyond_floor_p50_ms=beyond,
        cut_ins=sum(s.commits_before_end > 0 for s in paused), paused=len(paused),
        unanswered=sum(s.heard_at is None for s in said),
        worker_turn_ms=[s.worker_turn_ms for s in said if not s.utterance.paused and s.worker_turn_ms is not None])


def report(voice: str, echo: list[float], runs: dict[bool, list[Said]], out: Report | None = None) -> None:
    floor = statistics.median(echo) if echo else float("nan")
    print(f"\nvoice: {'Piper joe' if voice == 'piper' else 'espeak-ng ' + voice}; responder: echo; "
          "direct WebRTC (aiortc both ends)")
    print(f"  echo peer round trip (transport floor):         {fmt(echo)}")
    for end_of_turn, said in runs.items():
        name = "end-of-turn model on " if end_of_turn else "end-of-turn model off"
        figures = mode_figures(said, floor)
        print(f"  {name}: finished sentences, caller-heard  {fmt(figures.finished_ms)}")
        print(f"      minus the echo floor: p50 {figures.beyond_floor_p50_ms:6.0f} ms   (goal <= {GOAL_MS:.0f} ms)")
        print(f"      false cut-ins on mid-sentence pauses (300-400 ms): {figures.cut_ins}/{figures.paused}"
              f"   unanswered utterances: {figures.unanswered}")
        print(f"      the worker's own turn_ms (end of speech at its input -> first frame out): "
              f"{fmt(figures.worker_turn_ms)}")
        if out is not None:
            mode = "on" if end_of_turn else "off"
            heard = statistics.median(figures.finished_ms) if figures.finished_ms else None
            out.add("turn.heard_p50" if end_of_turn else "turn.heard_p50.eot_off",
                    f"turn latency as the caller hears it, p50 (end of speech -> reply heard), end-of-turn model "
                    f"{mode}; floor: a bare aiortc echo's round trip", heard, floor=floor, unit="ms",
                    n=len(figures.finished_ms), area="turn")
            out.add(f"turn.false_cut_ins.eot_{mode}", f"mid-sentence pauses (300-400 ms) taken as the end of the "
                    f"turn, end-of-turn model {mode}", 100 * figures.cut_ins / figures.paused if figures.paused
                    else None, unit="%", n=figures.paused, area="turn")


async def run(args: argparse.Namespace) -> None:
    address = args.ice_address or interface_ipv4()
    finished, paused = (5, 3) if args.quick else (12, 8)
    print(f"== caller-side turn latency: {finished} finished + {paused} paused utterances, each with the "
          "end-of-turn model off and on ==", flush=True)
    utterances = build_utterances(args.voice, finished, paused, args.seed)
    env = {k: v for k, v in os.environ.items() if k != "DUPLEX_API_KEY"}  # a local worker, no key
    env["HF_HUB_OFFLINE"] = "1"
    worker_port, echo_port = free_port(), free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--host", "127.0.0.1", "--port",
         str(worker_port), "--plugin", "reference", "--responder", "echo", "--ice-address", address],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    echo = subprocess.Popen([sys.executable, "-m", "bench.caller_turn_latency", "--serve-echo", str(echo_port),
                             "--ice-address", address], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None
        await asyncio.to_thread(echo.stdout.readline)
        worker_url, echo_url = f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{echo_port}"
        await wait_http(worker_url, "/healthz", 180)
        clips = [u.audio for u in utterances if not u.paused][: 5 if args.quick else 10]
        echo_trips = await echo_round_trips(echo_url, address, clips)
        print("   ... calling the worker: each utterance with the end-of-turn model off and on", flush=True)
        out = Report("caller_turn_latency", quick=args.quick)
        report(args.voice, echo_trips, await speak_turns(worker_url, address, utterances), out)
        out.write()
    finally:
        if echo.stdin:
            echo.stdin.close()
        worker.terminate()
        for proc in (echo, worker):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 utterances per mode instead of 20")
    parser.add_argument("--voice", default="en-gb-x-rp+m3",
                        help="espeak-ng voice (the tests use en-us and en-gb+f3), or 'piper' (the tests' voice, "
                             "whose prosody the end-of-turn model reads far better)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--ice-address", default="", help="local address for ICE (default: this machine's interface)")
    parser.add_argument("--serve-echo", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.serve_echo:
        asyncio.run(serve_echo(args.serve_echo, args.ice_address or interface_ipv4()))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
