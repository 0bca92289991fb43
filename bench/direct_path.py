"""The worker's call audio path: edge barge-in latency, added latency per direction, CPU per session.

a. Barge-in at the worker: a real CallAudioPath over a real LocalBackend with the
   scripted plugin (a long reply generated a little faster than real time) and the
   real Silero onset detector, on a paced 20 ms loop (one 48 kHz caller frame in,
   one ``next_frame()`` out per tick). Each trial lets the agent play 0.5-1 s, then
   feeds Piper speech and reads the path's own ``barge_in_ms`` figure.
b. Added latency: ``input_added_ms`` (caller frame in -> append handed to the
   conversation) and ``output_added_ms`` (audio delta in -> first frame out) from
   the same run, split into work and waiting, next to soxr LQ's own delay.
c. The per-frame edges alone (``bench.direct_edges``): Opus encode and decode as aiortc
   does them against ours, CPU per frame, alternating in the same run.
d. CPU per call at 4, 8 and 16 simultaneous calls over real WebRTC: the direct
   worker (``duplex-agent serve --plugin scripted``) and, in the same run, bare
   aiortc echo peers as the transport floor, each its own process, with callers
   that keep barging in (``bench.call_rounds``); the worker's figures from its
   ``/metrics``. The issue's marks: per call at 16 within 1.1x of per call at 4,
   and <= 3.5 % of a core per call.
e. Barge-in and turn latency as the caller hears them over real WebRTC, the worker beside
   a bare aiortc tone-reply floor with the same callers, alternating (``bench.direct_heard``);
   run before d. The issue's mark: barge-in beyond the floor <= 40 ms p95.

Prints figures next to the goals; never passes or fails on time.

Run: python -m bench.direct_path [--quick] [--barge-in-trials 25] [--heard-rounds 3] [--sessions 4,8,16]
     [--window 8] [--profile]
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.call_rounds import main, parse_args
from bench.stats import percentile, spread
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol.audio import StreamingResampler, as_float32_audio
from duplex_agent.agent.protocol.events import ClientEvent, InputAudioBufferAppend, ServerEvent
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.media.agent_output import RESAMPLE_QUALITY
from duplex_agent.webrtc.media.call_audio import CallAudioPath
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


_fig = spread


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
    vocabulary = ["the", "ship", "sailed", "on", "across", "the", "grey", "sea", "while", "the", "crew", "sang", "old", "songs"]
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


class TimedConversation(Conversation):
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

    def use_caller_vad(self, scores) -> None:  # noqa: ANN001
        self._inner.use_caller_vad(scores)

    async def close(self, reason: str = "client_closed") -> None:
        await self._inner.close(reason)


class TimedPlayout(PlayoutQueue):
    """The playout queue, noting when each response's first audio was queued (and its delta's arrival)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_queued: dict[str, tuple[float, float]] = {}  # response -> (delta received, queued)

    def capture(self, samples: np.ndarray, response_id: str, *, tag: Any = None) -> None:
        super().capture(samples, response_id, tag=tag)
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
    playout = TimedPlayout()
    path = CallAudioPath(conversation, vad_model=vad, playout=playout,  # same queue, timed
                         figures=LatencyFigures(keep=1_000_000))  # every figure, not the page's last 50
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
            if not await _wait(lambda: paced.agent_run * FRAME_S >= played_s, 15.0):  # noqa: B023 (called within this iteration)
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


# ---------------------------------------------------------------- report


@dataclass(frozen=True)
class Goal:
    """A p95 held to a limit; a figure with no samples (nan) does not meet it."""

    p95_ms: float
    limit_ms: float

    @property
    def met(self) -> bool:
        return self.p95_ms <= self.limit_ms


@dataclass(frozen=True)
class DirectGoals:
    """Parts a and b against their goals, worked out from a run's figures."""

    barge_in: Goal  # the path's barge_in_ms
    input_beyond_resampler: Goal  # input_added_ms less the resampler's hold at that append
    output_added: Goal  # output_added_ms: work and the wait for the frame clock
    output_work: Goal  # of output_added_ms, the work alone
    input_beyond: tuple[float, ...]  # the samples of input_beyond_resampler; empty when they do not pair up


def direct_goals(result: DirectResult) -> DirectGoals:
    recorded = [t.barge_in_ms for t in result.trials if t.barge_in_ms is not None]
    beyond_in = ([a - h for a, h in zip(result.input_added, result.input_held, strict=True)]
                 if len(result.input_added) == len(result.input_held) else [])
    return DirectGoals(
        barge_in=Goal(percentile(recorded, 95), BARGE_IN_GOAL_MS),
        input_beyond_resampler=Goal(percentile(beyond_in, 95), ADDED_GOAL_MS),
        output_added=Goal(percentile(result.output_added, 95), ADDED_GOAL_MS),
        output_work=Goal(percentile(result.output_work, 95), ADDED_GOAL_MS),
        input_beyond=tuple(beyond_in))


def report_direct(result: DirectResult, goals: DirectGoals, delays: list[ResamplerDelay]) -> None:
    trials = result.trials
    hit = [t for t in trials if t.barge_in_ms is not None]
    recorded = [t.barge_in_ms for t in hit if t.barge_in_ms is not None]
    acoustic = [t.from_acoustic_ms for t in hit if t.from_acoustic_ms is not None]
    print(f"a. barge-in at the worker ({len(trials)} trials; CallAudioPath + LocalBackend + ScriptedPlugin, "
          "real Silero onset, paced 20 ms loop: push one frame, pull one frame)")
    print(f"   barge_in_ms (the path's figure: VAD onset frame in -> first silent frame out): {_fig(recorded)}")
    print(f"      goal <= {goals.barge_in.limit_ms:.0f} ms p95: {'met' if goals.barge_in.met else 'NOT met'} "
          f"(p95 {goals.barge_in.p95_ms:.1f} ms)")
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
    beyond = goals.input_beyond_resampler
    print(f"     beyond the resampler's own delay: {_fig(list(goals.input_beyond), digits=3)}   "
          f"goal <= {beyond.limit_ms:.0f} ms p95: {'met' if beyond.met else 'NOT met'}")
    print(f"     (bench's own clock: push_caller_frame call -> append sent, incl. the onset VAD: "
          f"{_fig(result.input_work, digits=3)})")
    print(f"   output_added_ms (first delta of a response in -> its first frame out; the path's figure): "
          f"{_fig(result.output_added, digits=2)}")
    print(f"     work (delta in -> decoded, resampled, queued): {_fig(result.output_work, digits=3)}")
    print(f"     wait for the next 20 ms frame deadline: {_fig(result.output_wait, digits=2)}")
    out, work = goals.output_added, goals.output_work
    print(f"     the output resampler emits a delta's audio at once (its hold delays only the tail), so nothing of this "
          f"is the resampler's: goal <= {out.limit_ms:.0f} ms p95 {'met' if out.met else 'NOT met'} "
          f"(p95 {out.p95_ms:.1f} ms); the work alone {'meets' if work.met else 'misses'} it "
          f"(p95 {work.p95_ms:.3f} ms), the rest is waiting for the frame clock")


async def barge_in_and_latency(trials: int) -> None:
    import onnxruntime

    print(f"== duplex-agent: the worker's call audio path (python {platform.python_version()}, "
          f"{os.cpu_count()} cores, onnxruntime {onnxruntime.__version__}) ==", flush=True)
    started = time.perf_counter()
    rates = ((48000, 16000), (16000, 48000), (22050, 48000), (24000, 48000))
    delays = [resampler_delay(a, b) for a, b in rates] + [resampler_delay(a, b, "QQ") for a, b in rates[:2]]
    result = await direct_path(trials)
    report_direct(result, direct_goals(result), delays)
    print(f"   (a+b took {time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(__doc__.splitlines()[0], extra=[
        ("--barge-in-trials", {"type": int, "default": 25, "help": "part a's interruptions (0 skips parts a and b)"}),
        ("--edges-seconds", {"type": float, "default": None, "help": "part c's run per mode (4; quick: 2; 0 skips it)"}),
        ("--heard-rounds", {"type": int, "default": None, "help": "part e's rounds per server (3; quick: 1; 0 skips it)"}),
    ])
    if args.barge_in_trials:
        asyncio.run(barge_in_and_latency(8 if args.quick else args.barge_in_trials))
    if args.edges_seconds is None:
        args.edges_seconds = 2.0 if args.quick else 4.0
    if args.edges_seconds:
        from bench import direct_edges

        print("c. the per-frame edges alone, aiortc's way vs ours (16 calls on one loop; CPU per frame)", flush=True)
        asyncio.run(direct_edges.run(16, args.edges_seconds))
    if args.heard_rounds is None:
        args.heard_rounds = 1 if args.quick else 3
    if args.heard_rounds:
        from bench import direct_heard

        print("e. barge-in and turn latency as the caller hears them: the worker beside its floor, same run", flush=True)
        direct_heard.main(["--rounds", str(args.heard_rounds)])
    print("d. CPU per call over real WebRTC: the direct worker against bare aiortc echo peers, same run", flush=True)
    sys.exit(main(("direct", "echo"), "the direct path's CPU per call", args=args))
