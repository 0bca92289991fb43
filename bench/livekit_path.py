"""The LiveKit path beside the direct path: worker CPU per session and barge-in latency at the worker.

Everything runs as its own process, so each one's CPU is its own:

- the loopback LiveKit server (``python -m devtools.livekit_server``) on this machine's interface;
- a LiveKit worker, ``python -m agent.cli start --plugin scripted --agent-name bench-agent``;
- a direct worker, ``python -m agent.cli serve --plugin scripted`` (aiortc peers, ``POST /api/offer``);
- per round, N callers in one process (``bench.livekit_callers``): real livekit SDK callers, one
  room each, their tokens dispatching bench-agent; or N aiortc callers against the direct worker.

The scripted plugin answers every user turn with 10 words of 100 ms tone (1 s). Every caller
loops: say a Piper question, hear ~300 ms of the reply, say a short interruption that runs on into
the next question (one user turn), hear ~300 ms of that reply, ... The barge-in figures are the
workers' own (``barge-in: silent X ms after the caller's speech onset``, parsed from each worker's
log); CPU is psutil cpu_times deltas of each process over a steady window while all N sessions are
in that loop. Rounds alternate between the paths (N = 1, 2, 4, 8), so both are measured in the
same run under the same conditions; a path's larger N are skipped once it saturates the machine.
The callers also time, on the machine's shared clock, their onset reaching the worker (from its
log) and the agent's audio stopping at their ear.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_path [--sessions 1,2,4,8] [--trials 8,16,8,8] [--window 6] [--budget 210]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.stats import percentile, summary

REPO = Path(__file__).resolve().parents[1]
AGENT_NAME = "bench-agent"
API_KEY = "bench-key"
API_SECRET = "bench-secret-for-the-loopback-livekit-server"
BARGE_IN = re.compile(r"barge-in: silent ([0-9.]+) ms after the caller's speech onset")
STAMPED_BARGE_IN = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ barge-in: silent ([0-9.]+) ms",
                              re.MULTILINE)
CALL_FIGURES = re.compile(r"call figures: (\{.*\})\s*$", re.MULTILINE)
SERVING = re.compile(r"serving (\S+) \(")
PATHS = ("livekit", "direct")
#: A logged barge-in belongs to the caller's interruption whose onset went out at most this long before.
MATCH_WINDOW_S = 1.0


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
    env.update(LIVEKIT_API_KEY=API_KEY, LIVEKIT_API_SECRET=API_SECRET)  # credentials by environment, never argv
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _children_take_sigint() -> None:
    """A shell's background job starts with SIGINT ignored, and its children would inherit that (the
    workers stop on SIGINT); a handled signal is reset to the default in a child at exec instead."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_cpu_s() -> dict[int, float]:
    """user + system CPU seconds of every process on this machine, by pid.

    Summed from the processes, not read from /proc/stat: the kernel's per-CPU counters there are
    sampled at the timer tick and miss much of a load made of short wake-ups every 10-20 ms (audio
    frames), while a process's own times count its run time exactly.
    """
    out: dict[int, float] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
    return out


def tree_cpu_s(pid: int) -> dict[int, float]:
    """user + system CPU seconds of a process and each of its descendants, by pid."""
    out: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


# ---------------------------------------------------------------- processes


class Service:
    """A long-lived subprocess with its output in a log file; stopped with SIGINT, then SIGTERM, then SIGKILL."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.args, cwd=REPO, env=_child_env(), stdout=self._log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def text(self, start: int = 0) -> str:
        with self.log_path.open("rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")

    def size(self) -> int:
        return self.log_path.stat().st_size

    def stop(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            for sig, wait_s in ((signal.SIGINT, 8.0), (signal.SIGTERM, 4.0), (signal.SIGKILL, 4.0)):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                try:
                    proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log is not None:
            self._log.close()
            self._log = None


def start_server(log_dir: Path, host: str) -> tuple[Service, str]:
    """The loopback LiveKit server; its URL is the first line it prints."""
    server = Service("livekit-server", [sys.executable, "-m", "devtools.livekit_server", "--host", host, "--port", "0",
                                        "--print-url"],
                     log_dir / "livekit-server.log")
    server.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"the loopback LiveKit server exited:\n{server.text()[-2000:]}")
        match = re.search(r"^(ws://\S+)$", server.text(), re.MULTILINE)
        if match:
            return server, match.group(1)
        time.sleep(0.1)
    raise RuntimeError("the loopback LiveKit server printed no URL in 30 s")


def wait_for_log(service: Service, pattern: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.text()[-3000:]}")
        if pattern in service.text():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{service.name}: no {pattern!r} in its log after {timeout:.0f} s:\n{service.text()[-3000:]}")


def healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def wait_for_health(service: Service, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.text()[-3000:]}")
        if healthz(port) is not None:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{service.name} did not answer /healthz in {timeout:.0f} s:\n{service.text()[-3000:]}")


# ---------------------------------------------------------------- one round


@dataclass
class Round:
    path: str
    sessions: int
    serving: int = 0  # sessions the worker had open when the window began
    ready: bool = False
    window_s: float = float("nan")
    worker_cores: float = float("nan")
    server_cores: float = float("nan")
    callers_cores: float = float("nan")
    machine_cores: float = float("nan")
    barge_in_ms: list[float] = field(default_factory=list)
    interruptions: int = 0
    heard_stop_ms: list[float] = field(default_factory=list)
    played_out: int = 0  # interruptions after which the caller still heard the whole reply
    reply_after_ms: list[float] = field(default_factory=list)
    up_leg_ms: list[float] = field(default_factory=list)  # caller onset sent -> the worker's onset frame
    underruns: int | None = None
    no_reply: int = 0
    rejoins: int = 0  # LiveKit: callers the worker served again after they dropped and came back
    caller_errors: list[str] = field(default_factory=list)
    loud_share: float = float("nan")  # share of received agent audio that was loud (the agent talking)
    note: str = ""
    took_s: float = 0.0


class Bench:
    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        self.args = args
        self.log_dir = log_dir
        self.server: Service | None = None
        self.url = ""
        self.livekit_worker: Service | None = None
        self.direct_worker: Service | None = None
        self.direct_port = 0
        self.speech_file = ""
        self.callers_pids: set[int] = set()
        self.idle: dict[str, float] = {}

    # -- set-up / tear-down

    def start(self) -> None:
        from duplex_agent.webrtc.direct.host_address import interface_ipv4

        host = interface_ipv4()  # LiveKit media needs ICE on a real interface; only this machine's address
        self.server, self.url = start_server(self.log_dir, host)
        common = ["--plugin", "scripted", "--max-sessions", str(max(8, max(self.args.session_counts)))]
        self.livekit_worker = Service("livekit-worker", [
            sys.executable, "-m", "duplex_agent.agent.app.cli", "start", *common, "--livekit-url", self.url,
            "--agent-name", AGENT_NAME,
        ], self.log_dir / "livekit-worker.log")
        self.direct_port = _free_port()
        self.direct_worker = Service("direct-worker", [
            sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", *common, "--host", "127.0.0.1", "--port", str(self.direct_port),
        ], self.log_dir / "direct-worker.log")
        self.livekit_worker.start()
        self.direct_worker.start()
        wait_for_log(self.livekit_worker, "registered worker", 60)
        wait_for_health(self.direct_worker, self.direct_port, 60)

    def stop(self) -> None:
        for pid in list(self.callers_pids):  # callers of an interrupted round
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                proc.terminate()
                try:
                    proc.wait(5)
                except psutil.TimeoutExpired:
                    proc.kill()
        for service in (self.livekit_worker, self.direct_worker, self.server):
            if service is not None:
                service.stop()
        if self.speech_file:
            with contextlib.suppress(OSError):
                os.unlink(self.speech_file)

    def worker(self, path: str) -> Service:
        service = self.livekit_worker if path == "livekit" else self.direct_worker
        assert service is not None
        return service

    def measure_idle(self, seconds: float = 3.0) -> None:
        assert self.server is not None
        pids = {"livekit": self.worker("livekit").pid, "direct": self.worker("direct").pid, "server": self.server.pid}
        before = {k: tree_cpu_s(pid) for k, pid in pids.items()}
        busy0, t0 = all_cpu_s(), time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - t0
        self.idle = {k: cpu_delta(before[k], tree_cpu_s(pid)) / wall for k, pid in pids.items()}
        self.idle["machine"] = cpu_delta(busy0, all_cpu_s()) / wall

    # -- a round

    def _serving(self, path: str, log_start: int) -> int:
        if path == "livekit":
            return len(set(SERVING.findall(self.worker(path).text(log_start))))
        health = healthz(self.direct_port) or {}
        return int(health.get("sessions", 0))

    async def _wait_sessions_closed(self, path: str, log_start: int, sessions: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path == "livekit":
                if len(CALL_FIGURES.findall(self.worker(path).text(log_start))) >= sessions:
                    return True
            elif int((healthz(self.direct_port) or {}).get("sessions", -1)) == 0:
                return True
            await asyncio.sleep(0.2)
        return False

    async def round(self, path: str, sessions: int, want: int) -> Round:
        args = self.args
        result = Round(path, sessions)
        started = time.perf_counter()
        worker = self.worker(path)
        assert self.server is not None
        log_start = worker.size()
        command = [sys.executable, "-m", "bench.livekit_callers", "--transport", path, "--sessions", str(sessions),
                   "--seconds", str(args.round_limit + 30), "--speech", self.speech_file]
        if path == "livekit":
            command += ["--url", self.url,
                        "--agent-name", AGENT_NAME, "--room-prefix", f"bench-{sessions}-{uuid.uuid4().hex[:6]}"]
        else:
            command += ["--url", f"http://127.0.0.1:{self.direct_port}"]
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=REPO, env=_child_env(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        self.callers_pids.add(proc.pid)
        events: list[dict[str, Any]] = []
        ready = asyncio.Event()
        attempts = 0

        async def read() -> None:
            nonlocal attempts
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                events.append(message)
                if message.get("event") in ("ready", "not_ready"):
                    result.ready = message.get("event") == "ready"
                    if not result.ready:
                        result.note = (f"only {message.get('hearing')} of {sessions} callers heard the agent "
                                       f"({message.get('connected')} connected)")
                    ready.set()
                elif message.get("event") == "progress":
                    attempts = int(message.get("attempts", 0))

        reader = asyncio.create_task(read())
        done: dict[str, Any] | None = None
        try:
            try:
                await asyncio.wait_for(ready.wait(), 60)
            except TimeoutError:
                result.note = "callers not ready after 60 s"
            await asyncio.sleep(args.warmup)
            result.serving = self._serving(path, log_start)
            pids = {"worker": worker.pid, "server": self.server.pid, "callers": proc.pid}
            before = {k: tree_cpu_s(pid) for k, pid in pids.items()}
            busy0, t0 = all_cpu_s(), time.perf_counter()
            await asyncio.sleep(args.window)
            after = {k: tree_cpu_s(pid) for k, pid in pids.items()}
            busy1 = all_cpu_s()
            wall = time.perf_counter() - t0
            result.machine_cores = cpu_delta(busy0, busy1) / wall
            result.window_s = wall
            result.worker_cores = cpu_delta(before["worker"], after["worker"]) / wall
            result.server_cores = cpu_delta(before["server"], after["server"]) / wall
            result.callers_cores = cpu_delta(before["callers"], after["callers"]) / wall
            # Barge-in trials: keep going until this round has its share of interruptions.
            limit = min(started + args.round_limit, time.perf_counter() + args.trial_wait)
            while attempts < want and time.perf_counter() < limit and proc.returncode is None and not reader.done():
                await asyncio.sleep(0.1)
            if attempts < want:
                result.note = (result.note + "; " if result.note else "") + f"{attempts}/{want} interruptions by the round's limit"
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader, 5)
            self.callers_pids.discard(proc.pid)
        done = next((e for e in events if e.get("event") == "done"), None)
        if not await self._wait_sessions_closed(path, log_start, result.serving or sessions, 10.0):
            result.note = (result.note + "; " if result.note else "") + "sessions still open 10 s after the callers left"
        await asyncio.sleep(0.3)
        text = worker.text(log_start)
        if path == "livekit":
            served = SERVING.findall(text)
            result.rejoins = len(served) - len(set(served))
        result.barge_in_ms = [float(v) for v in BARGE_IN.findall(text)]
        callers = (done or {}).get("callers", [])
        result.interruptions = sum(int(c.get("attempts", 0)) for c in callers)
        result.no_reply = sum(int(c.get("no_reply", 0)) for c in callers)
        result.heard_stop_ms = [float(v) for c in callers for v in c.get("heard_stop_ms", [])]
        result.played_out = sum(int(c.get("played_out", 0)) for c in callers)
        result.reply_after_ms = [float(v) for c in callers for v in c.get("reply_after_ms", [])]
        result.up_leg_ms = up_legs(text, sorted(float(v) for c in callers for v in c.get("onsets_wall", [])))
        result.caller_errors = [str(c["error"]) for c in callers if c.get("error")]
        received = sum(float(c.get("received_ms", 0)) for c in callers)
        result.loud_share = sum(float(c.get("loud_ms", 0)) for c in callers) / received if received else float("nan")
        if path == "livekit":
            figures = []
            for raw in CALL_FIGURES.findall(text):
                with contextlib.suppress(ValueError, SyntaxError):
                    import ast

                    figures.append(ast.literal_eval(raw))
            result.underruns = sum(int(f.get("underruns", 0)) for f in figures) if figures else None
        else:
            underruns = [c.get("worker_figures", {}).get("underruns") for c in callers]
            result.underruns = sum(int(u) for u in underruns if u is not None) if any(u is not None for u in underruns) else None
        if done is None:
            result.note = (result.note + "; " if result.note else "") + "callers printed no figures"
        result.took_s = time.perf_counter() - started
        return result


def up_legs(log_text: str, onsets_wall: list[float]) -> list[float]:
    """Caller's onset handed to its transport -> the worker's onset frame, per logged barge-in.

    The worker logs each barge-in X ms after the onset frame arrived (log time, 1 ms steps); every
    process on this machine shares the wall clock, so the caller's onset times line up with it.
    """
    import datetime

    legs = []
    unused = list(onsets_wall)  # each interruption accounts for one barge-in at most
    for stamp, ms in STAMPED_BARGE_IN.findall(log_text):
        logged = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        onset_at_worker = logged - float(ms) / 1000.0
        earlier = [t for t in unused if t <= onset_at_worker + 0.002 and onset_at_worker - t < MATCH_WINDOW_S]
        if earlier:
            unused.remove(earlier[-1])
            legs.append(1000.0 * (onset_at_worker - earlier[-1]))
    return legs


# ---------------------------------------------------------------- report


def _p50_p95(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f}/{percentile(values, 95):.1f}"


def report(bench: Bench, rounds: list[Round], skipped: list[str]) -> None:
    idle = bench.idle
    cores = os.cpu_count() or 1
    print()
    rest = idle["machine"] - idle["livekit"] - idle["direct"] - idle["server"]
    print(f"idle, before any call (cores): livekit worker {idle['livekit']:.3f}, direct worker {idle['direct']:.3f}, "
          f"loopback server {idle['server']:.3f}; the rest of the machine {rest:.3f} (of {cores})")
    print(f"CPU: psutil cpu_times deltas over a {bench.args.window:.0f} s window while every session loops "
          "question -> ~300 ms of reply -> interruption + question -> ~300 ms of reply ...; per session = (worker cores - its idle) / sessions")
    print()
    # The compact table: both paths side by side, per session count.
    header = (f"{'path':8} | {'sessions':>8} | {'worker cores':>12} | {'% core per session':>18} | "
              f"{'barge-in p50/p95 ms (n)':>23}")
    print(header)
    print("-" * len(header))
    for sessions in sorted({r.sessions for r in rounds}):
        for r in (r for r in rounds if r.sessions == sessions):
            per = 100.0 * (r.worker_cores - idle[r.path]) / max(1, r.serving or r.sessions)
            bi = f"{_p50_p95(r.barge_in_ms)} ({len(r.barge_in_ms)})"
            count = f"{r.serving}" if r.serving == r.sessions else f"{r.serving} of {r.sessions}"
            notes = [r.note] if r.note else []
            if r.machine_cores >= 0.9 * cores:
                notes.append(f"machine saturated: {r.machine_cores:.2f} of {cores} cores busy")
            print(f"{r.path:8} | {count:>8} | {r.worker_cores:12.3f} | {per:18.1f} | {bi:>23}"
                  + (f"   [{'; '.join(notes)}]" if notes else ""))
    for line in skipped:
        print(f"(skipped {line})")
    print()
    print("context per round: the other processes' cores over the same window (server = loopback LiveKit server, "
          "callers = the callers' process, rest = everything else on the machine: the idle other worker, this "
          "bench, unrelated processes), playout underruns at the worker, interruptions the worker did not barge "
          "in on (no barge-in logged within 1 s of the interruption's onset: the reply had already played out when "
          "the caller's speech reached it), other barge-ins the worker logged (not within 1 s of an interruption), questions the caller "
          "heard no reply to within 12 s, LiveKit callers served again after dropping out of their room, and the "
          "caller's wait from the end of its question to the reply's first sound (500 ms end-of-turn silence "
          "included)")
    header2 = (f"{'path':8} | {'sessions':>8} | {'server':>6} | {'callers':>7} | {'rest':>5} | {'machine':>7} | "
               f"{'underruns':>9} | {'missed barge-ins':>16} | {'other':>5} | {'unanswered':>10} | {'rejoins':>7} | "
               f"{'reply heard p50 ms':>18}")
    print(header2)
    print("-" * len(header2))
    for sessions in sorted({r.sessions for r in rounds}):
        for r in (r for r in rounds if r.sessions == sessions):
            rest = r.machine_cores - r.worker_cores - r.server_cores - r.callers_cores
            missed = f"{max(0, r.interruptions - len(r.up_leg_ms))} of {r.interruptions}"
            other = len(r.barge_in_ms) - len(r.up_leg_ms)
            print(f"{r.path:8} | {r.sessions:>8} | {r.server_cores:6.2f} | {r.callers_cores:7.2f} | {rest:5.2f} | "
                  f"{r.machine_cores:7.2f} | {'?' if r.underruns is None else r.underruns:>9} | {missed:>16} | {other:>5} | "
                  f"{r.no_reply:>10} | {r.rejoins if r.path == 'livekit' else '-':>7} | "
                  f"{statistics.median(r.reply_after_ms) if r.reply_after_ms else float('nan'):18.0f}")
    print()
    print("barge-in at the worker, all rounds of a path pooled (the worker's own figure: VAD onset frame in -> "
          "first silent frame out, from its log):")
    for path in PATHS:
        mine = [r for r in rounds if r.path == path]
        values = [v for r in mine for v in r.barge_in_ms]
        interruptions = sum(r.interruptions for r in mine)
        light = [v for r in mine if r.sessions <= 2 for v in r.barge_in_ms]
        matched = sum(len(r.up_leg_ms) for r in mine)
        print(f"  {path:8} {summary(values, 'ms')}; edge barge-ins {len(values)} ({matched} on the callers' "
              f"{interruptions} interruptions)"
              + (f"; with <= 2 sessions: {summary(light, 'ms')}" if light else ""))
    print("at the caller (every process shares this machine's clock):")
    for path in PATHS:
        mine = [r for r in rounds if r.path == path]
        up = [v for r in mine for v in r.up_leg_ms]
        stop = [v for r in mine for v in r.heard_stop_ms]
        reply = [v for r in mine for v in r.reply_after_ms]
        played = sum(r.played_out for r in mine)
        print(f"  {path:8} up leg, caller's onset sent -> the worker's onset frame: {summary(up, 'ms')}")
        print(f"  {'':8} heard the agent stop, onset sent -> first quiet agent frame (replies cut short): "
              f"{summary(stop, 'ms')}; {played} replies played out past the interruption")
        print(f"  {'':8} reply heard, question's end sent -> first loud agent frame (500 ms end-of-turn silence "
              f"included): {summary(reply, 'ms')}")
    # Slope of worker cores against sessions: the marginal cost of one more session.
    print("worker CPU against sessions (rounds where the machine had a core to spare):")
    for path in PATHS:
        mine = [r for r in rounds if r.path == path and r.serving > 0 and r.machine_cores < 0.9 * cores]
        if len(mine) >= 2:
            slope, intercept = np.polyfit([r.serving for r in mine], [r.worker_cores for r in mine], 1)
            print(f"  {path:8} worker cores ~= {intercept:.3f} + {slope:.3f} x sessions (least squares over "
                  f"{len(mine)} unsaturated rounds): {100 * slope:.1f}% of a core per added session")
    errors = [(r.path, r.sessions, e) for r in rounds for e in r.caller_errors]
    if errors:
        print(f"caller errors: {errors[:5]}")
    print()
    print(f"notes: all processes share this machine's {cores} cores (the 'machine' column sums every process's "
          "CPU, this bench's own included); the loopback LiveKit server is a Python SFU that decodes and re-encodes every "
          "track (aiortc), unlike LiveKit's real SFU which forwards RTP, so its CPU and its share of the caller's "
          "latency are not LiveKit's. The callers' column is the callers' process (livekit SDK / aiortc).")


# ---------------------------------------------------------------- main


def write_speech(path: str) -> None:
    from bench.livekit_callers import INTERRUPTIONS, QUESTIONS, SAMPLE_RATE
    from devtools.speech import speak

    speech = {f"q{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(QUESTIONS)}
    speech.update({f"i{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(INTERRUPTIONS)})
    np.savez(path, **speech)


async def run(bench: Bench) -> None:
    args = bench.args
    cores = os.cpu_count() or 1
    started = time.perf_counter()
    rounds: list[Round] = []
    skipped: list[str] = []
    saturated: dict[str, int] = {}  # path -> the session count at which it saturated the machine
    for sessions in args.session_counts:
        elapsed = time.perf_counter() - started
        # The next session count takes about as long as the last one did, both paths together.
        if rounds and elapsed + sum(r.took_s for r in rounds[-len(PATHS):]) > args.budget:
            skipped.append(f"{sessions} sessions, both paths: the run's time budget of {args.budget:.0f} s was spent")
            continue
        for path in PATHS:
            if path in saturated and not args.past_saturation:
                skipped.append(f"{path} at {sessions} sessions: at {saturated[path]} the machine was already "
                               "saturated or most barge-ins came too late (--past-saturation runs it anyway)")
                continue
            result = await bench.round(path, sessions, args.round_trials[sessions])
            rounds.append(result)
            missed = result.interruptions - len(result.up_leg_ms)
            if (result.machine_cores >= 0.9 * cores or (result.interruptions >= 4 and 2 * missed > result.interruptions)
                    or (args.round_trials[sessions] > 0 and result.interruptions == 0)):
                saturated.setdefault(path, sessions)
            print(f"   ... {path:8} {sessions} sessions: worker {result.worker_cores:.3f} cores, "
                  f"barge-in {_p50_p95(result.barge_in_ms)} ms ({len(result.barge_in_ms)}/{result.interruptions}), "
                  f"{result.took_s:.0f} s" + (f" [{result.note}]" if result.note else ""), flush=True)
    report(bench, rounds, skipped)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,2,4,8", help="concurrent sessions per round, per path")
    parser.add_argument("--window", type=float, default=6.0, help="steady CPU window per round, seconds")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds after every caller hears the agent")
    parser.add_argument("--trials", default="8,16,8,8",
                        help="interruptions each round waits for, by --sessions entry (0: the CPU window only); "
                             "the light rounds carry most of them, where the machine has cores to spare")
    parser.add_argument("--round-limit", type=float, default=60.0, help="most seconds of one round")
    parser.add_argument("--trial-wait", type=float, default=22.0,
                        help="most seconds a round waits for its interruptions after the CPU window")
    parser.add_argument("--past-saturation", action="store_true",
                        help="run a path's larger session counts even after a round of it saturated the machine")
    parser.add_argument("--budget", type=float, default=210.0,
                        help="skip the larger session counts when the rounds would run past this many seconds")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their folder is printed)")
    args = parser.parse_args()
    args.session_counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    trials = [int(n) for n in args.trials.split(",") if n.strip()]
    args.round_trials = {n: trials[i] if i < len(trials) else (trials[-1] if trials else 0)
                         for i, n in enumerate(args.session_counts)}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import livekit.rtc

    print(f"== duplex-agent: the LiveKit path beside the direct path (python {platform.python_version()}, "
          f"{os.cpu_count()} cores, livekit {livekit.rtc.__version__}) ==", flush=True)
    started = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-livekit-"))
    bench = Bench(args, log_dir)
    # SIGTERM: unwind through the finally below, so every process is stopped.
    _children_take_sigint()
    signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    try:
        bench.speech_file = str(log_dir / "speech.npz")
        write_speech(bench.speech_file)
        bench.start()
        print(f"   loopback LiveKit server {bench.url} (pid {bench.server.pid if bench.server else '?'}), "
              f"LiveKit worker pid {bench.worker('livekit').pid}, direct worker http://127.0.0.1:{bench.direct_port} "
              f"(pid {bench.worker('direct').pid}); scripted plugin; set-up {time.perf_counter() - started:.0f} s",
              flush=True)
        bench.measure_idle()
        asyncio.run(run(bench))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception as exc:
        print(f"bench.livekit_path failed: {exc!r}", file=sys.stderr)
        status = 1
    finally:
        bench.stop()
        if args.keep_logs or status:
            print(f"logs: {log_dir}")
        else:
            for path in log_dir.iterdir():
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                log_dir.rmdir()
    print(f"total {time.perf_counter() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
