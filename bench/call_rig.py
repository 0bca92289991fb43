"""The call rounds' rig: the processes of a run and how one round is driven and sampled.

Every party is its own process, so each one's CPU is its own (psutil cpu_times deltas over a steady
window): the workers (``duplex-agent serve``, or ``duplex-agent start --metrics-port`` beside the loopback LiveKit
server), the bare aiortc echo peer (``bench.echo_peer``), and per round N callers in one process
(``bench.livekit_callers``). What a round measured goes into a ``bench.call_figures.Round``; this
module judges nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.call_figures import Round, is_control, kind, over_livekit
from bench.worker_profile import finish_profile, start_profile

REPO = Path(__file__).resolve().parents[1]
AGENT_NAME = "bench-agent"
API_KEY = "bench-key"
API_SECRET = "bench-secret-for-the-loopback-livekit-server"
#: Idle CPU is read over this many windows of this many seconds before any call; the least counts.
IDLE_WINDOWS = 3
IDLE_WINDOW_S = 3.0


def agent_name(path: str) -> str:
    return AGENT_NAME + ("-echo" if kind(path) == "livekit-echo" else "") + ("-control" if is_control(path) else "")


def child_env() -> dict[str, str]:
    """The children's environment: the loopback LiveKit credentials travel here, not in arguments."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", LIVEKIT_API_KEY=API_KEY, LIVEKIT_API_SECRET=API_SECRET)
    return env


def children_take_sigint() -> None:
    """A shell's background job starts with SIGINT ignored, and its children would inherit that (the
    workers stop on SIGINT); a handled signal is reset to the default in a child at exec instead."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def free_port() -> int:
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


def thread_cpu_ticks(pid: int) -> list[tuple[str, int]]:
    """Each live thread of the process: its name and its user + system CPU in clock ticks
    (/proc/PID/task/*/stat); empty when the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    threads = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended
        threads.append(_name_and_ticks(stat))
    return threads


def _name_and_ticks(stat: str) -> tuple[str, int]:
    """A thread's name and its user + system CPU in clock ticks, from its /proc stat line."""
    name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
    return name, int(fields[11]) + int(fields[12])  # utime + stime


def thread_counters(pid: int) -> dict[int, tuple[str, int, int]]:
    """Each live thread of the process by id: its kind (``python``: the process's own name, which
    Python's threads keep; else the native thread's name, digits dropped), its CPU in clock ticks and
    its wake-ups (voluntary context switches: each time it blocked and was woken), from /proc."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            own = f.read().strip()
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out = {}
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = f.read()
        except OSError:
            continue  # ended
        name, ticks = _name_and_ticks(stat)
        switches = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
        kind_ = "python" if name == own else re.sub(r"[-_ ]?\d+$", "", name) or name
        out[int(task)] = (kind_, ticks, int(switches.group(1)) if switches else 0)
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """The process's Python threads by id: their Python names, digits dropped (py-spy dump); empty without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): "python: " + re.sub(r"[-_]\d+", "", name)
            for tid, name in re.findall(r'^Thread (\d+) \(.*?\): "(.*)"', dump, re.M)}


def thread_kinds_per_call(before: dict[int, tuple[str, int, int]], after: dict[int, tuple[str, int, int]],
                          wall: float, calls: int) -> dict[str, tuple[float, float]]:
    """Per thread kind over a window: % of a core per call and wake-ups per call second (threads
    that started in the window count from zero; ones that ended in it are not seen)."""
    ticks_s = os.sysconf("SC_CLK_TCK")
    out: dict[str, list[float]] = {}
    for tid, (kind_, ticks, wakeups) in after.items():
        _, ticks0, wakeups0 = before.get(tid, (kind_, 0, 0))
        row = out.setdefault(kind_, [0.0, 0.0])
        row[0] += (ticks - ticks0) / ticks_s
        row[1] += wakeups - wakeups0
    per = max(1, calls) * wall
    return {k: (100.0 * cpu / per, n / per) for k, (cpu, n) in sorted(out.items(), key=lambda kv: -kv[1][0])}


def native_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the process's threads that are not Python's: those a native library
    started and named (livekit's FFI: tokio, WebRTC's network, audio and encoder threads).
    Python threads keep the process's own name, the end-of-turn and VAD inference included."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            own = f.read().strip()
    except OSError:
        return 0.0
    ticks = sum(t for name, t in thread_cpu_ticks(pid) if name != own)
    return ticks / os.sysconf("SC_CLK_TCK")


def run_queue_wait_s(pid: int) -> float:
    """Seconds the process's main thread (the worker's event loop) has spent runnable but waiting
    for a CPU (Linux /proc schedstat); nan elsewhere. On an oversubscribed machine a worker that
    does its work on one thread gets one thread's share of the cores, whatever it needs."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


# ---------------------------------------------------------------- a worker's /metrics


@dataclass
class Scrape:
    sessions: float = 0.0
    underruns: float = 0.0
    end_of_turn_inferences: float = 0.0
    end_of_turn_cpu_s: float = 0.0
    barge_in_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    machine_busy: float | None = None  # the worker's own reading of the machine's CPUs (--max-cpu)

    def barge_ins_since(self, earlier: Scrape) -> dict[float, float]:
        return {le: count - earlier.barge_in_buckets.get(le, 0.0) for le, count in self.barge_in_buckets.items()}


def scrape(port: int, *, tries: int = 3) -> Scrape | None:
    """The worker's figures; None when it does not answer (a loaded worker gets a few tries)."""
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
            break
        except OSError:
            if attempt == tries - 1:
                return None
            time.sleep(0.5)
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "duplex_sessions_active" and sample.labels.get("transport") == "all":
                out.sessions = sample.value
            elif sample.name == "duplex_playout_underruns_total":
                out.underruns = sample.value
            elif sample.name == "duplex_end_of_turn_inferences_total":
                out.end_of_turn_inferences = sample.value
            elif sample.name == "duplex_end_of_turn_cpu_seconds_total":
                out.end_of_turn_cpu_s = sample.value
            elif sample.name == "duplex_barge_in_latency_ms_bucket":
                out.barge_in_buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == "duplex_machine_cpu_busy":
                out.machine_busy = sample.value
    return out


# ---------------------------------------------------------------- processes


class Service:
    """A long-lived subprocess with its output in a log file; stopped with SIGINT, then SIGTERM, then SIGKILL."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.name = name
        self.args = args
        self.cwd = cwd  # "python -m" imports from here first: the checkout whose code runs
        self.log_path = log_path
        self.env = {**child_env(), **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.args, cwd=self.cwd, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self) -> str:
        return self.log_path.read_bytes()[-3000:].decode("utf-8", "replace")

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


def start_loopback_server(log_dir: Path, host: str) -> tuple[Service, str]:
    """The loopback LiveKit server; its URL is the first line it prints (its one structured output).
    Its credentials come from the environment every child gets, never from argv."""
    server = Service("livekit-server", [sys.executable, "-m", "devtools.livekit_server", "--host", host, "--port", "0",
                                        "--print-url"],
                     log_dir / "livekit-server.log")
    server.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"the loopback LiveKit server exited:\n{server.tail()}")
        match = re.search(r"^(ws://\S+)$", server.log_path.read_text(errors="replace"), re.MULTILINE)
        if match:
            return server, match.group(1)
        time.sleep(0.1)
    raise RuntimeError("the loopback LiveKit server printed no URL in 30 s")


def wait_for_metrics(service: Service, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.tail()}")
        if scrape(port, tries=1) is not None:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{service.name} did not answer /metrics in {timeout:.0f} s:\n{service.tail()}")


# ---------------------------------------------------------------- the run's processes and rounds


class CpuWindow:
    """The counters a round's steady window is measured between: taken on opening, and on closing
    turned into the cores each party (``pids``: worker, callers, maybe server) used over the window."""

    def __init__(self, pids: dict[str, int], metrics_port: int) -> None:
        self.pids = pids
        self.metrics_port = metrics_port
        worker = pids["worker"]
        self._end_of_turn = scrape(metrics_port)
        self._trees = {k: tree_cpu_s(pid) for k, pid in pids.items()}
        self._native = native_thread_cpu_s(worker)
        self._threads = thread_counters(worker)
        self.threads: dict[str, tuple[float, float]] = {}  # on closing: by thread kind, see thread_kinds_per_call
        self._waited = run_queue_wait_s(worker)
        self._machine, self._t0 = all_cpu_s(), time.perf_counter()

    def close(self, into: Round) -> None:
        worker = self.pids["worker"]
        trees = {k: tree_cpu_s(pid) for k, pid in self.pids.items()}
        native = native_thread_cpu_s(worker)
        threads = thread_counters(worker)
        waited = run_queue_wait_s(worker) - self._waited
        machine = all_cpu_s()
        wall = time.perf_counter() - self._t0
        end_of_turn = scrape(self.metrics_port)
        if self._end_of_turn is not None and end_of_turn is not None:
            into.end_of_turn_cores = (end_of_turn.end_of_turn_cpu_s - self._end_of_turn.end_of_turn_cpu_s) / wall
        into.native_cores = (native - self._native) / wall
        into.machine_cores = cpu_delta(self._machine, machine) / wall
        into.window_s = wall
        into.loop_waited = waited / wall
        into.worker_cores = cpu_delta(self._trees["worker"], trees["worker"]) / wall
        into.server_cores = cpu_delta(self._trees["server"], trees["server"]) / wall if "server" in self.pids else 0.0
        into.callers_cores = cpu_delta(self._trees["callers"], trees["callers"]) / wall
        names = python_thread_names(worker)  # after the window: py-spy's look is not in it
        threads = {tid: (names.get(tid, kind_), ticks, n) for tid, (kind_, ticks, n) in threads.items()}
        self.threads = thread_kinds_per_call(self._threads, threads, wall, into.sessions)


class Rig:
    """The processes of one run: the paths' workers (and the loopback server for LiveKit)."""

    def __init__(self, args: argparse.Namespace, paths: tuple[str, ...], log_dir: Path) -> None:
        self.args = args
        self.paths = paths
        self.log_dir = log_dir
        self.server: Service | None = None
        self.livekit_url = ""
        self.workers: dict[str, Service] = {}
        self.ports: dict[str, int] = {}
        self.speech_file = str(log_dir / "speech.npz")
        self.callers_pids: set[int] = set()
        self.idle: dict[str, float] = {}
        self.idle_windows: dict[str, list[float]] = {}  # each worker's idle windows, in order

    def start(self) -> None:
        from duplex_agent.webrtc.direct.host_address import interface_ipv4

        host = interface_ipv4()  # media needs ICE on a real interface; only this machine's address
        capacity = str(max(8, max(self.args.session_counts) + 2))
        common = ["--plugin", "scripted", "--max-sessions", capacity]
        for path in self.paths:
            port = self.ports[path] = free_port()
            # A control worker runs another checkout's code: its venv's python, from its folder.
            checkout = Path(self.args.control) if is_control(path) else REPO
            python = str(checkout / ".venv" / "bin" / "python") if is_control(path) else sys.executable
            env: dict[str, str] = {}
            if over_livekit(path):
                if self.server is None:
                    self.server, self.livekit_url = start_loopback_server(self.log_dir, host)
                command = [python, "-m", "duplex_agent.agent.app.cli", "start", "--metrics-port", str(port)] \
                    if kind(path) == "livekit" else [python, "-m", "bench.livekit_echo_agent", "--metrics-port", str(port)]
                env = {"DUPLEX_PLUGIN": "scripted", "DUPLEX_MAX_SESSIONS": capacity, "LIVEKIT_URL": self.livekit_url,
                       "DUPLEX_AGENT_NAME": agent_name(path)}
            elif kind(path) == "direct":
                command = [python, "-m", "duplex_agent.agent.app.cli", "serve", *common,
                           "--host", "127.0.0.1", "--port", str(port)]
            else:
                command = [python, "-m", "bench.echo_peer", "--port", str(port), "--ice-address", host]
            service = self.workers[path] = Service(f"{path} worker", command,
                                                   self.log_dir / f"{path.replace('@', '-')}.log", env, checkout)
            service.start()
        for path, service in self.workers.items():
            wait_for_metrics(service, self.ports[path], 90)

    def stop(self) -> None:
        for pid in list(self.callers_pids):  # callers of an interrupted round
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                proc.terminate()
                try:
                    proc.wait(5)
                except psutil.TimeoutExpired:
                    proc.kill()
        for service in (*self.workers.values(), self.server):
            if service is not None:
                service.stop()

    def measure_idle(self, windows: int = IDLE_WINDOWS, seconds: float = IDLE_WINDOW_S) -> None:
        """Each worker's CPU with no call: the least of ``windows`` windows. A worker that answers
        /metrics may still be starting (the LiveKit worker registering and loading its models:
        0.16 cores in the first 3 s, 0.03-0.05 after), and that work, subtracted from every
        round as idle, made its per-call figure read low."""
        pids = {path: service.pid for path, service in self.workers.items()}
        readings: dict[str, list[float]] = {k: [] for k in pids}
        for _ in range(windows):
            before = {k: tree_cpu_s(pid) for k, pid in pids.items()}
            t0 = time.perf_counter()
            time.sleep(seconds)
            wall = time.perf_counter() - t0
            for k, pid in pids.items():
                readings[k].append(cpu_delta(before[k], tree_cpu_s(pid)) / wall)
        self.idle = {k: min(r) for k, r in readings.items()}
        self.idle_windows = readings

    async def _sessions_closed(self, path: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            figures = scrape(self.ports[path])
            if figures is not None and figures.sessions == 0:
                return True
            await asyncio.sleep(0.2)
        return False

    async def round(self, path: str, sessions: int, want: int, *, profile: bool = False) -> Round:
        args = self.args
        result = Round(path, sessions)
        started = time.perf_counter()
        worker = self.workers[path]
        port = self.ports[path]
        ready_within = 60.0 + 10.0 * sessions  # LiveKit callers join one room at a time
        command = [sys.executable, "-m", "bench.livekit_callers", "--sessions", str(sessions),
                   "--seconds", str(ready_within + args.round_limit), "--speech", self.speech_file]
        if over_livekit(path):
            command += ["--transport", "livekit", "--url", self.livekit_url, "--agent-name", agent_name(path),
                        "--room-prefix", f"bench-{sessions}-{uuid.uuid4().hex[:6]}"]
        else:
            command += ["--transport", "direct", "--url", f"http://127.0.0.1:{port}"]
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=REPO, env=child_env(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
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
        before_round = scrape(port) or Scrape()
        try:
            try:
                await asyncio.wait_for(ready.wait(), ready_within)
            except TimeoutError:
                result.note = "callers not ready in time"
            await asyncio.sleep(args.warmup)
            result.serving = int((scrape(port) or Scrape()).sessions)
            pids = {"worker": worker.pid, "callers": proc.pid}
            if over_livekit(path) and self.server is not None:
                pids["server"] = self.server.pid
            spy = start_profile(worker.pid, args.window, self.log_dir / f"{path}-{sessions}.txt") if profile else None
            window = CpuWindow(pids, port)
            await asyncio.sleep(args.window)
            window.close(result)
            print(f"   ... {path:16} {sessions:2d} calls, worker threads, % core / wake-ups per call second: "
                  + ", ".join(f"{k} {cpu:.2f}/{n:.0f}" for k, (cpu, n) in window.threads.items() if cpu >= 0.05),
                  flush=True)
            if spy is not None:
                result.profile = await finish_profile(spy)
            # Barge-in trials: keep going until this round has its share of interruptions.
            limit = min(started + args.round_limit, time.perf_counter() + args.trial_wait)
            while attempts < want and time.perf_counter() < limit and proc.returncode is None and not reader.done():
                await asyncio.sleep(0.1)
            if attempts < want:
                result.add_note(f"{attempts}/{want} interruptions by the round's limit")
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
        if not await self._sessions_closed(path, 15.0):
            result.add_note("sessions still open 15 s after the callers left")
        after_round = scrape(port) or before_round
        result.barge_in = after_round.barge_ins_since(before_round)
        result.underruns = int(after_round.underruns - before_round.underruns)
        result.end_of_turn_inferences = int(after_round.end_of_turn_inferences - before_round.end_of_turn_inferences)
        done = next((e for e in events if e.get("event") == "done"), None)
        callers = (done or {}).get("callers", [])
        result.interruptions = sum(int(c.get("attempts", 0)) for c in callers)
        result.no_reply = sum(int(c.get("no_reply", 0)) for c in callers)
        result.heard_stop_ms = [float(v) for c in callers for v in c.get("heard_stop_ms", [])]
        result.reply_after_ms = [float(v) for c in callers for v in c.get("reply_after_ms", [])]
        result.caller_errors = [str(c["error"]) for c in callers if c.get("error")]
        if done is None:
            result.add_note("callers printed no figures")
        result.took_s = time.perf_counter() - started
        return result


#: Interruptions in words and espeak-ng voices no test uses: barge-in on speech its rules were not tuned on.
OTHER_VOICES = ("en-us", "en-gb+f3", "en-us+m3")
OTHER_WORDS = ("stop stop wait a moment", "excuse me", "actually no", "hang on a second")


def other_voice(text: str, voice: str, rate: int) -> np.ndarray:
    """espeak-ng's ``voice`` saying ``text``, at a caller's level."""
    from devtools.speech import espeak

    return 0.5 * espeak(text, rate, voice=voice)


def write_speech(path: str, *, other_voices: bool = False) -> None:
    """The callers' phrases at 48 kHz; ``other_voices``: the interruptions are OTHER_WORDS in
    OTHER_VOICES, said where the tests' would be."""
    from bench.livekit_callers import INTERRUPTIONS, QUESTIONS, SAMPLE_RATE
    from devtools.speech import speak

    speech = {f"q{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(QUESTIONS)}
    if other_voices:
        speech.update({f"i{i}": other_voice(OTHER_WORDS[i % len(OTHER_WORDS)], OTHER_VOICES[i % len(OTHER_VOICES)],
                                            SAMPLE_RATE) for i in range(len(INTERRUPTIONS))})
    else:
        speech.update({f"i{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(INTERRUPTIONS)})
    np.savez(path, **speech)
