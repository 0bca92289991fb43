"""The worker's call audio path: edge barge-in latency, added latency per direction, CPU per session.

a. Barge-in at the worker: a real CallAudioPath over a real LocalBackend with the
   scripted plugin (a long reply generated a little faster than real time) and the
   real Silero onset detector, on a paced 20 ms loop (one 48 kHz caller frame in,
   one ``next_frame()`` out per tick). Each trial lets the agent play 0.5-1 s, then
   feeds Piper speech and reads the path's own ``barge_in_ms`` figure.
b. Added latency: ``input_added_ms`` (caller frame in -> append handed to the
   conversation) and ``output_added_ms`` (audio delta in -> first frame out) from
   the same run, split into work and waiting, next to soxr LQ's own delay.
c. CPU per session over real WebRTC: the worker app (scripted plugin) in this
   process, N aiortc callers in a subprocess (``bench.webrtc_callers``) so their
   CPU is theirs; this process's CPU seconds per wall second over a steady window
   while every session plays the agent's reply, and playout underruns.

Prints figures next to the goals; never passes or fails on time.

Run: python -m bench.direct_path [--trials 25] [--peers 1,2,4,8,12] [--window 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.stats import percentile
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol.audio import StreamingResampler, as_float32_audio
from duplex_agent.agent.protocol.events import ClientEvent, InputAudioBufferAppend, ServerEvent
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.media.call_audio import RESAMPLE_QUALITY, CallAudioPath
from duplex_agent.webrtc.media.latency import LatencyFigures
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE, PlayoutQueue

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
BARGE_IN_GOAL_MS = 80.0
ADDED_GOAL_MS = 5.0
PROMPT = "Please tell me a long story about the sea and the ships."
INTERRUPTIONS = [
    "Wait, stop please.",
    "Hold on a second.",
    "Sorry, can I ask something?",
    "No, that is not what I meant.",
    "Excuse me, one question.",
    "Okay, thanks, that's enough.",
    "Stop, stop.",
    "Hang on, let me think.",
]
#: An audio frame is agent audio when any sample is non-zero; cleared playout gives exact zeros.
SPEECH_ONSET_RMS = 0.01  # -40 dBFS over 5 ms: where the caller's sound starts


def _p(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def _fig(values: list[float], unit: str = "ms", digits: int = 1) -> str:
    if not values:
        return "no samples"
    return (f"p50 {statistics.median(values):.{digits}f} {unit}, p95 {_p(values, 95):.{digits}f} {unit}, "
            f"max {max(values):.{digits}f} {unit} (n={len(values)})")


def machine_busy_s() -> float:
    """CPU seconds all processes on this machine have used (Linux /proc/stat); nan elsewhere."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def long_reply(words: int) -> str:
    vocabulary = "the ship sailed on across the grey sea while the crew sang old songs".split()
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(words))


def acoustic_onset(samples: np.ndarray, rate: int = 48000) -> int:
    """Index of the first 5 ms block whose RMS passes SPEECH_ONSET_RMS."""
    block = rate // 200
    for start in range(0, samples.size - block, block):
        if float(np.sqrt(np.mean(samples[start : start + block] ** 2))) > SPEECH_ONSET_RMS:
            return start
    return 0


# ---------------------------------------------------------------- soxr's own delay


@dataclass
class ResamplerDelay:
    quality: str
    in_rate: int
    out_rate: int
    chunk_sizes: str  # samples out per 20 ms chunk in, steady state
    held_mean_ms: float  # input received but not yet emitted, after each 20 ms chunk
    held_max_ms: float
    group_ms: float  # an impulse's position out minus its position in


def resampler_delay(in_rate: int, out_rate: int, quality: str = RESAMPLE_QUALITY) -> ResamplerDelay:
    resampler = StreamingResampler(in_rate, out_rate, quality=quality)
    chunk = in_rate // 50
    # A smooth pulse (Gaussian, sigma 0.5 ms) off a chunk boundary: survives any quality's filter.
    impulse_at = in_rate // 2 + in_rate // 1000 * 3 + 7
    t = (np.arange(in_rate) - impulse_at) / in_rate
    signal = np.exp(-0.5 * (t / 0.0005) ** 2).astype(np.float32)
    outs, held, sizes = [], [], []
    emitted = 0
    for k, start in enumerate(range(0, signal.size, chunk)):
        out = resampler.process(signal[start : start + chunk])
        outs.append(out)
        sizes.append(out.size)
        emitted += out.size
        if k >= 5:  # past the start-up transient
            held.append(1000.0 * ((start + chunk) / in_rate - emitted / out_rate))
    out = np.concatenate(outs)
    peak = int(np.argmax(np.abs(out)))
    group = 1000.0 * (peak / out_rate - impulse_at / in_rate)
    steady = sorted(set(sizes[5:]))
    return ResamplerDelay(quality, in_rate, out_rate, "/".join(map(str, steady)), statistics.fmean(held), max(held), group)


# ---------------------------------------------------------------- a + b: the paced direct path


class TimedConversation:
    """The runner as a Conversation, noting when each append was handed to it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.last_append_at = 0.0
        self.appended_ms = 0.0  # model-rate audio handed on so far

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def capabilities(self):  # noqa: ANN201
        return self._inner.capabilities

    def send(self, event: ClientEvent) -> None:
        if isinstance(event, InputAudioBufferAppend):
            self.last_append_at = time.perf_counter()
            samples = event.audio.size
            self.appended_ms += 1000.0 * samples / self._inner.capabilities.input_sample_rate
        self._inner.send(event)

    def events(self) -> AsyncIterator[ServerEvent]:
        return self._inner.events()

    async def close(self, reason: str = "client_closed") -> None:
        await self._inner.close(reason)


class TimedPlayout(PlayoutQueue):
    """The playout queue, noting when each response's first audio was queued (and its delta's arrival)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_queued: dict[str, tuple[float, float]] = {}  # response -> (delta received, queued)

    def push(self, samples: np.ndarray, response_id: str, *, tag: Any = None) -> None:
        super().push(samples, response_id, tag=tag)
        if tag is not None and np.asarray(samples).size and response_id not in self.first_queued:
            self.first_queued[response_id] = (float(tag), time.perf_counter())


class Mic:
    """Caller audio at 48 kHz, one 20 ms frame per tick; knows which frame holds the sound's onset."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, np.float32)
        self._onset_in: int | None = None  # samples until the onset

    @property
    def busy(self) -> bool:
        return self._pending.size > 0

    def say(self, audio: np.ndarray) -> None:
        self._onset_in = self._pending.size + acoustic_onset(audio)
        self._pending = np.concatenate([self._pending, audio.astype(np.float32)])

    def next_frame(self) -> tuple[np.ndarray, bool]:
        frame = np.zeros(FRAME_SAMPLES, np.float32)
        chunk, self._pending = self._pending[:FRAME_SAMPLES], self._pending[FRAME_SAMPLES:]
        frame[: chunk.size] = chunk
        has_onset = False
        if self._onset_in is not None:
            if self._onset_in < FRAME_SAMPLES:
                has_onset = True
                self._onset_in = None
            else:
                self._onset_in -= FRAME_SAMPLES
        return frame, has_onset


@dataclass
class Trial:
    phrase: str
    played_before_ms: float
    barge_in_ms: float | None = None  # the path's own figure (VAD onset frame in -> first silent frame)
    from_acoustic_ms: float | None = None  # first frame with the caller's sound in -> first silent frame
    first_frame_silent: bool | None = None
    loud_after: int = 0  # agent frames after the barge-in, until the caller's speech was all fed
    frames_after: int = 0


@dataclass
class PacedLoop:
    """Pushes one caller frame and pulls one output frame every 20 ms on a wall-clock schedule."""

    path: CallAudioPath
    conversation: TimedConversation
    playout: TimedPlayout
    mic: Mic = field(default_factory=Mic)
    agent_run: int = 0  # consecutive output frames with agent audio
    trial: Trial | None = None
    counting_after: bool = False
    onset_at: float | None = None
    input_work_ms: list[float] = field(default_factory=list)
    input_held_ms: list[float] = field(default_factory=list)  # caller audio in but not yet handed on, per append
    output_work_ms: list[float] = field(default_factory=list)
    output_wait_ms: list[float] = field(default_factory=list)
    tick_late_ms: list[float] = field(default_factory=list)
    running: bool = True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tick = 0
        outputs_seen = 0
        while self.running:
            tick += 1
            deadline = start + tick * FRAME_S
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.tick_late_ms.append(max(0.0, 1000.0 * (loop.time() - deadline)))
            frame, has_onset = self.mic.next_frame()
            barge_ins = self.path.barge_ins
            pushed_at = time.perf_counter()
            self.path.push_caller_frame(frame, 48000)
            if self.conversation.last_append_at >= pushed_at:
                self.input_work_ms.append(1000.0 * (self.conversation.last_append_at - pushed_at))
                self.input_held_ms.append(tick * FRAME_S * 1000.0 - self.conversation.appended_ms)
            if has_onset:
                self.onset_at = pushed_at
            out = self.path.next_frame()
            out_at = time.perf_counter()
            loud = bool(np.any(out))
            self.agent_run = self.agent_run + 1 if loud else 0

            added = self.path.figures.recent("output_added_ms")
            if len(added) > outputs_seen:
                outputs_seen = len(added)
                rid = self.path.playout.current_response_id
                queued = self.playout.first_queued.get(rid) if rid else None
                if queued is not None:
                    received_at, queued_at = queued
                    self.output_work_ms.append(1000.0 * (queued_at - received_at))
                    self.output_wait_ms.append(added[-1] - 1000.0 * (queued_at - received_at))

            trial = self.trial
            if trial is None:
                continue
            if self.path.barge_ins > barge_ins and trial.first_frame_silent is None:
                trial.first_frame_silent = not loud
                trial.barge_in_ms = self.path.figures.last("barge_in_ms")
                if self.onset_at is not None:
                    trial.from_acoustic_ms = 1000.0 * (out_at - self.onset_at)
                self.counting_after = True
            elif self.counting_after:
                trial.frames_after += 1
                trial.loud_after += loud
            if self.counting_after and not self.mic.busy:
                self.counting_after = False


async def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


@dataclass
class DirectResult:
    trials: list[Trial]
    missed: int
    no_reply: int
    input_added: list[float]
    output_added: list[float]
    input_work: list[float]
    input_held: list[float]
    output_work: list[float]
    output_wait: list[float]
    tick_late: list[float]
    resets: int
    own_cores: float
    machine_cores: float


async def direct_path(trials: int, seed: int = 7) -> DirectResult:
    from devtools.speech import speak

    rng = random.Random(seed)
    vad = await asyncio.to_thread(SileroVadModel.shared)
    prompt = speak(PROMPT, 48000, before_ms=300)
    phrases = {text: speak(text, 48000) for text in INTERRUPTIONS}

    plugin = ScriptedPlugin(as_float32_audio, Script(reply=long_reply(300), word_ms=100, word_delay_s=0.08))
    backend = LocalBackend(plugin, plugin.build_local_engine(), vad_model=vad)
    conversation = TimedConversation(await backend.open())
    path = CallAudioPath(conversation, vad_model=vad)
    playout = TimedPlayout()
    path.playout = playout  # same queue, timed
    path.figures = LatencyFigures(keep=1_000_000)  # keep every figure, not the page's last 50
    await path.start()

    paced = PacedLoop(path, conversation, playout)
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()
    pacer = asyncio.create_task(paced.run(), name="paced-loop")
    done: list[Trial] = []
    missed = no_reply = resets = 0
    try:
        paced.mic.say(prompt)
        attempt = 0
        while len(done) < trials and attempt < trials * 2:
            attempt += 1
            played_s = rng.uniform(0.5, 1.0)
            if not await _wait(lambda: paced.agent_run * FRAME_S >= played_s, 15.0):
                no_reply += 1  # the reply never came: ask again
                await _wait(lambda: not paced.mic.busy, 10.0)
                paced.mic.say(prompt)
                resets += 1
                continue
            # The next reply's first word comes at a random phase of the 20 ms frame clock.
            plugin.script.word_delay_s = rng.uniform(0.07, 0.09)
            phrase = INTERRUPTIONS[len(done) % len(INTERRUPTIONS)]
            trial = Trial(phrase, played_before_ms=paced.agent_run * FRAME_S * 1000.0)
            paced.onset_at = None
            paced.trial = trial
            paced.mic.say(phrases[phrase])
            await _wait(lambda: not paced.mic.busy and not paced.counting_after, 10.0)
            paced.trial = None
            if trial.first_frame_silent is None:
                missed += 1
            done.append(trial)
    finally:
        paced.running = False
        await pacer
        wall = time.perf_counter() - wall0
        own_cores, machine_cores = (time.process_time() - cpu0) / wall, (machine_busy_s() - busy0) / wall
        await path.close()
        await conversation.close()
        await backend.close()
    return DirectResult(
        trials=done, missed=missed, no_reply=no_reply,
        input_added=path.figures.recent("input_added_ms"), output_added=path.figures.recent("output_added_ms"),
        input_work=paced.input_work_ms, input_held=paced.input_held_ms, output_work=paced.output_work_ms, output_wait=paced.output_wait_ms,
        tick_late=paced.tick_late_ms, resets=resets, own_cores=own_cores, machine_cores=machine_cores,
    )


# ---------------------------------------------------------------- c: CPU per session over real WebRTC


@dataclass
class CpuRound:
    peers: int
    sessions: int
    speaking: int
    window_s: float
    cpu_cores: float
    underruns: int
    frames_out_per_s: float
    loop_lag_p95_ms: float
    loop_lag_max_ms: float
    callers: dict[str, Any] | None
    machine_cores: float = float("nan")  # all processes on the machine, over the window
    loop_thread_cores: float = float("nan")  # the event loop's own thread (aiortc, runner, call audio path)
    note: str = ""


async def _loop_lag(samples: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        before = loop.time()
        await asyncio.sleep(0.01)
        samples.append(max(0.0, 1000.0 * (loop.time() - before - 0.01)))


async def _callers_done(proc: asyncio.subprocess.Process, timeout: float) -> dict[str, Any] | None:
    assert proc.stdout is not None
    result = None
    try:
        async with asyncio.timeout(timeout):
            while line := await proc.stdout.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if message.get("event") == "done":
                    result = message
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
    return result


async def cpu_per_session(peer_counts: list[int], window_s: float) -> tuple[float, list[CpuRound]]:
    from aiohttp import web

    from devtools.speech import speak
    from duplex_agent.agent.app.server import build_app
    from duplex_agent.agent.app.settings import Settings
    from duplex_agent.webrtc.direct.host_address import interface_ipv4
    from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS

    address = interface_ipv4()
    vad = await asyncio.to_thread(SileroVadModel.shared)
    # Generated at ~1.1x real time: the reply keeps the playout fed as long as this
    # process keeps up, and underruns when it does not.
    plugin = ScriptedPlugin(as_float32_audio, Script(reply=long_reply(400), word_ms=100, word_delay_s=0.09))
    max_sessions = max(peer_counts) + 4
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=max_sessions, vad_model=vad)
    app = build_app(backend, Settings(ice_address=address, max_sessions=max_sessions))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    registry = app[WEBRTC_PEERS]

    speech_file = tempfile.NamedTemporaryFile(suffix=".npy", delete=False)
    np.save(speech_file, speak(PROMPT, 48000))
    speech_file.close()

    # What the idle worker costs.
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(2.0)
    idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0)

    rounds: list[CpuRound] = []
    try:
        for peers in peer_counts:
            round_ = await _cpu_round(registry, url, address, speech_file.name, peers, window_s)
            if not _clean(round_) and _other_cores(round_) > 0.3:
                # Other processes on this shared machine took CPU in the window: measure once more.
                print(f"   ... {peers:2d} callers: not clean ({round_.underruns} underruns, "
                      f"{round_.frames_out_per_s:.1f} frames/s, loop lag p95 {round_.loop_lag_p95_ms:.0f} ms) "
                      f"while other processes used "
                      f"{_other_cores(round_):.2f} cores; measuring again", flush=True)
                round_ = await _cpu_round(registry, url, address, speech_file.name, peers, window_s)
                round_.note = (round_.note + "; " if round_.note else "") + "second try"
            rounds.append(round_)
            saturated = round_.machine_cores > 0.9 * (os.cpu_count() or 1)
            if saturated:
                round_.note = (round_.note + "; " if round_.note else "") + "machine saturated"
            print(f"   ... {peers:2d} callers: {round_.cpu_cores:.2f} cores, underruns {round_.underruns}"
                  f"{' (' + round_.note + ')' if round_.note else ''}", flush=True)
            if not _clean(round_) or saturated:
                break
    finally:
        await registry.close_all()
        await runner.cleanup()
        await backend.close()
        os.unlink(speech_file.name)
    return idle, rounds


def _other_cores(r: CpuRound) -> float:
    """Cores other processes (not the worker, not the callers) used in the round's window."""
    return r.machine_cores - r.cpu_cores - ((r.callers or {}).get("callers_cpu_cores") or 0.0)


async def _cpu_round(registry: Any, url: str, address: str, speech: str, peers: int, window_s: float) -> CpuRound:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.webrtc_callers", "--url", url, "--peers", str(peers),
        "--seconds", str(window_s + 60), "--ice-address", address, "--speech", speech,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    sessions = lambda: list(registry.sessions.values())  # noqa: E731
    note = ""
    # Steady state: every session is playing the agent's reply.
    ready = await _wait(lambda: len(sessions()) == peers and all(s.audio.playout.playing for s in sessions()), 40.0)
    if not ready:
        note = f"only {sum(s.audio.playout.playing for s in sessions())}/{peers} sessions playing after 40 s"
    await asyncio.sleep(1.0)
    live = sessions()
    lag: list[float] = []
    stop = asyncio.Event()
    lag_task = asyncio.create_task(_loop_lag(lag, stop))
    underruns0 = sum(s.audio.playout.underruns for s in live)
    frames0 = sum(s.audio.playout.frames_out for s in live)
    cpu0, wall0, busy0, thread0 = time.process_time(), time.perf_counter(), machine_busy_s(), time.thread_time()
    await asyncio.sleep(window_s)
    thread_cpu = time.thread_time() - thread0
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    busy = machine_busy_s() - busy0
    underruns = sum(s.audio.playout.underruns for s in live) - underruns0
    frames = sum(s.audio.playout.frames_out for s in live) - frames0
    speaking = sum(s.audio.playout.playing for s in live)
    stop.set()
    await lag_task
    if speaking < len(live) and not note:
        note = f"{len(live) - speaking} sessions stopped playing in the window"

    assert proc.stdin is not None
    proc.stdin.close()
    callers = await _callers_done(proc, 30.0)
    await _wait(lambda: not registry.sessions, 15.0)
    if registry.sessions:
        await registry.close_all()
    await asyncio.sleep(0.5)
    return CpuRound(
        peers=peers, sessions=len(live), speaking=speaking, window_s=wall, cpu_cores=cpu / wall,
        underruns=underruns, frames_out_per_s=frames / wall / max(1, len(live)),
        loop_lag_p95_ms=_p(lag, 95), loop_lag_max_ms=max(lag) if lag else float("nan"), callers=callers,
        machine_cores=busy / wall, loop_thread_cores=thread_cpu / wall, note=note,
    )


# ---------------------------------------------------------------- report


def report_direct(result: DirectResult, delays: list[ResamplerDelay]) -> None:
    trials = result.trials
    hit = [t for t in trials if t.barge_in_ms is not None]
    recorded = [t.barge_in_ms for t in hit if t.barge_in_ms is not None]
    acoustic = [t.from_acoustic_ms for t in hit if t.from_acoustic_ms is not None]
    p95 = _p(recorded, 95)
    print(f"a. barge-in at the worker ({len(trials)} trials; CallAudioPath + LocalBackend + ScriptedPlugin, "
          "real Silero onset, paced 20 ms loop: push one frame, pull one frame)")
    print(f"   barge_in_ms (the path's figure: VAD onset frame in -> first silent frame out): {_fig(recorded)}")
    print(f"      goal <= {BARGE_IN_GOAL_MS:.0f} ms p95: {'met' if p95 <= BARGE_IN_GOAL_MS else 'NOT met'} "
          f"(p95 {p95:.1f} ms)")
    print(f"   from acoustic onset (frame holding the first -40 dBFS 5 ms block in -> first silent frame out): "
          f"{_fig(acoustic)}")
    silent_first = sum(1 for t in hit if t.first_frame_silent)
    loud_after = sum(t.loud_after for t in hit)
    frames_after = sum(t.frames_after for t in hit)
    print(f"   edge barge-ins: {len(hit)}/{len(trials)} trials; first frame after the barge-in silent in "
          f"{silent_first}/{len(hit)}; agent frames after the barge-in (until the caller's speech was all fed): "
          f"{loud_after} of {frames_after} frames, worst trial {max((t.loud_after for t in hit), default=0)}")
    print(f"   agent audio played before each interruption: {_fig([t.played_before_ms for t in trials], digits=0)}")
    if result.no_reply:
        print(f"   {result.no_reply} times no reply came within 15 s and the prompt was said again")
    print(f"   pacing: tick lateness {_fig(result.tick_late)}; this process used {result.own_cores:.2f} cores, "
          f"other processes on the machine {result.machine_cores - result.own_cores:.2f} of {os.cpu_count()}")

    print(f"b. added latency per direction (soxr {RESAMPLE_QUALITY}, same run)")
    print("   the resampler's own delay, 20 ms chunks in (held = input in but not yet out; group = pulse peak in -> out;"
          " soxr's stream trims its filter delay, so its delay is the hold):")
    for d in delays:
        print(f"     {d.quality} {d.in_rate:>5} -> {d.out_rate:>5} Hz: held {d.held_mean_ms:5.2f} ms mean / "
              f"{d.held_max_ms:5.2f} ms max, group delay {d.group_ms:5.2f} ms, output per chunk {d.chunk_sizes}")
    print(f"   input_added_ms (frame in -> append handed on; the path's figure, counts the hold): "
          f"{_fig(result.input_added, digits=2)}")
    print(f"     of which the resampler's hold at that append: {_fig(result.input_held, digits=2)}")
    beyond_in = ([a - h for a, h in zip(result.input_added, result.input_held, strict=True)]
                 if len(result.input_added) == len(result.input_held) else [])
    print(f"     beyond the resampler's own delay: {_fig(beyond_in, digits=3)}   goal <= {ADDED_GOAL_MS:.0f} ms p95: "
          f"{'met' if _p(beyond_in, 95) <= ADDED_GOAL_MS else 'NOT met'}")
    print(f"     (bench's own clock: push_caller_frame call -> append sent, incl. the onset VAD: "
          f"{_fig(result.input_work, digits=3)})")
    print(f"   output_added_ms (first delta of a response in -> its first frame out; the path's figure): "
          f"{_fig(result.output_added, digits=2)}")
    print(f"     work (delta in -> decoded, resampled, queued): {_fig(result.output_work, digits=3)}")
    print(f"     wait for the next 20 ms frame deadline: {_fig(result.output_wait, digits=2)}")
    p95_out, p95_work = _p(result.output_added, 95), _p(result.output_work, 95)
    print(f"     the output resampler emits a delta's audio at once (its hold delays only the tail), so nothing of this "
          f"is the resampler's: goal <= {ADDED_GOAL_MS:.0f} ms p95 {'met' if p95_out <= ADDED_GOAL_MS else 'NOT met'} "
          f"(p95 {p95_out:.1f} ms); the work alone {'meets' if p95_work <= ADDED_GOAL_MS else 'misses'} it "
          f"(p95 {p95_work:.3f} ms), the rest is waiting for the frame clock")


def report_cpu(idle: float, rounds: list[CpuRound], window_s: float) -> None:
    cores = os.cpu_count() or 1
    print(f"c. CPU per session over real WebRTC (build_app + scripted plugin in this process; aiortc callers in a "
          f"subprocess; {window_s:.0f} s window while every session plays the reply; {cores} cores shared by both)")
    print(f"   idle worker: {idle:.3f} cores")
    print("   callers  sessions  worker cores (loop thread)  per session (% core)  underruns  frames/s/session  loop lag p95/max ms  "
          "callers' cores*  other processes' cores*  caller frames/s (min)  caller heard reply")
    clean = []
    for r in rounds:
        per = (r.cpu_cores - idle) / max(1, r.sessions)
        peers = (r.callers or {}).get("peers", [])
        rates = [p["frames_per_s"] for p in peers if p.get("frames_per_s")]
        heard = sum(1 for p in peers if p.get("loud_frames", 0) > 25)
        callers_cpu = (r.callers or {}).get("callers_cpu_cores")
        print(f"   {r.peers:7d}  {r.sessions:8d}  {r.cpu_cores:12.3f} ({r.loop_thread_cores:.3f})  {100 * per:20.1f}  {r.underruns:9d}  "
              f"{r.frames_out_per_s:16.1f}  {r.loop_lag_p95_ms:8.1f}/{r.loop_lag_max_ms:<8.1f}  "
              f"{callers_cpu if callers_cpu is not None else float('nan'):14.2f}  "
              f"{_other_cores(r):22.2f}  "
              f"{min(rates) if rates else float('nan'):21.1f}  {heard}/{len(peers)}"
              + (f"  [{r.note}]" if r.note else ""))
        errors = [p["error"] for p in peers if p.get("error")]
        if errors:
            print(f"            caller errors: {errors[:3]}")
        if _clean(r):
            clean.append(r)
    print("   * the callers' cores are over their whole run (start-up included), not the window, so 'other "
          "processes' (machine busy - worker - callers) is approximate and can dip below 0")
    print("   clean = no underruns, every session playing, >= 49.5 frames/s per session, loop lag p95 <= 20 ms")
    no_underruns = [r for r in rounds if r.underruns == 0 and r.sessions == r.peers and r.speaking == r.sessions]
    if no_underruns:
        most = max(no_underruns, key=lambda r: r.peers)
        print(f"   most sessions without playout underruns: {most.peers} on {most.cpu_cores:.2f} cores of this process "
              f"({most.peers / max(most.cpu_cores, 1e-6):.1f} per core; loop lag p95 {most.loop_lag_p95_ms:.1f} ms)")
    if not clean:
        print("   concurrent sessions per core without playout underruns: none measured clean")
        return
    best = max(clean, key=lambda r: r.peers)
    per = max(1e-6, (best.cpu_cores - idle) / best.sessions)
    line = (f"   concurrent sessions per core without playout underruns: {best.peers} sessions ran clean on "
            f"{best.cpu_cores:.2f} cores of this process = {best.peers / max(best.cpu_cores, 1e-6):.1f} sessions per "
            f"core measured; at {100 * per:.1f}% of a core per session, ~{1 / per:.0f} per core extrapolated")
    if len(clean) >= 2:
        slope, _ = np.polyfit([r.sessions for r in clean], [r.cpu_cores for r in clean], 1)
        if slope > 0:
            line += f"; marginal cost {100 * slope:.1f}% of a core per added session (~{1 / slope:.0f} per core)"
    print(line)
    print("   (on this 2-core machine the callers' process and any other processes share the cores: see their columns)")


def _clean(r: CpuRound) -> bool:
    return (r.underruns == 0 and r.sessions == r.peers and r.speaking == r.sessions
            and r.frames_out_per_s >= 49.5 and r.loop_lag_p95_ms <= 20.0)


async def main(args: argparse.Namespace) -> None:
    import onnxruntime

    print(f"== duplex-agent: the worker's call audio path (python {platform.python_version()}, "
          f"{os.cpu_count()} cores, onnxruntime {onnxruntime.__version__}) ==", flush=True)
    started = time.perf_counter()
    rates = ((48000, 16000), (16000, 48000), (22050, 48000), (24000, 48000))
    delays = [resampler_delay(a, b) for a, b in rates] + [resampler_delay(a, b, "QQ") for a, b in rates[:2]]
    result = await direct_path(args.trials)
    report_direct(result, delays)
    print(f"   (a+b took {time.perf_counter() - started:.0f} s)", flush=True)
    if args.peers:
        started_c = time.perf_counter()
        idle, rounds = await cpu_per_session([int(n) for n in args.peers.split(",")], args.window)
        report_cpu(idle, rounds, args.window)
        print(f"   (c took {time.perf_counter() - started_c:.0f} s)")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description="Edge barge-in latency, added latency and CPU per session.")
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--peers", default="1,2,4,8,12", help="caller counts for part c; empty to skip it")
    parser.add_argument("--window", type=float, default=8.0, help="steady measurement window of part c, seconds")
    asyncio.run(main(parser.parse_args()))
