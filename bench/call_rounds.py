"""Rounds of N simultaneous calls against workers in processes of their own: CPU per call, from /metrics.

Shared by ``bench.direct_path`` and ``bench.livekit_path``. Every party is its own
process, so each one's CPU is its own (psutil cpu_times deltas over a steady window):

- ``direct``: the worker, ``duplex-agent serve --plugin scripted`` (aiortc peers, ``POST /api/offer``);
- ``livekit``: the loopback LiveKit server (``devtools.livekit_server``) and the LiveKit worker
  (``bench.livekit_worker``: ``duplex-agent start`` plus ``/metrics``);
- ``echo``: the transport floor, bare aiortc peers echoing each caller (``bench.echo_peer``);
- ``livekit-echo``: the LiveKit barge-in floor, a bare ``livekit.rtc`` agent that answers with a tone
  and stops on the caller's energy (``bench.livekit_echo_agent``), through the same loopback server;
- per round, N callers in one process (``bench.livekit_callers``), each looping: say a question,
  hear ~300 ms of the reply, say an interruption that runs on into the next question.

The workers' figures (open sessions, playout underruns, the barge-in latency histogram) come from
their ``/metrics``; the callers' figures from the JSON lines they print. Rounds of the paths
alternate at each N, so every path is measured in the same run under the same load.
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
from prometheus_client.parser import text_string_to_metric_families

from bench.stats import histogram_quantile, summary

REPO = Path(__file__).resolve().parents[1]
AGENT_NAME = "bench-agent"
API_KEY = "bench-key"
API_SECRET = "bench-secret-for-the-loopback-livekit-server"
#: What each path is held to: % of a core per call (the issue's targets); echo is the floor.
TARGET_PER_CALL = {"direct": 3.5, "livekit": 2.0}
#: Per call at the largest N over per call at the smallest: "linear" means within this.
LINEAR_WITHIN = 1.1
CONTROL = "@control"
#: A worker's loop thread that waited for a CPU this share of the window could not keep up.
STARVED = 0.25
#: A round with the machine this busy (share of its cores) is saturated.
SATURATED = 0.9


def kind(path: str) -> str:
    """direct, livekit, echo or livekit-echo: what a path is, whichever checkout runs it."""
    return path.removesuffix(CONTROL)


def over_livekit(path: str) -> bool:
    return kind(path) in ("livekit", "livekit-echo")


def is_control(path: str) -> bool:
    return path.endswith(CONTROL)


def agent_name(path: str) -> str:
    return AGENT_NAME + ("-echo" if kind(path) == "livekit-echo" else "") + ("-control" if is_control(path) else "")


def describe(path: str) -> str:
    return DESCRIBE[kind(path)] + (" [control checkout]" if is_control(path) else "")


DESCRIBE = {
    "direct": "direct worker (aiortc peers)",
    "livekit": "LiveKit worker (livekit SDK; loopback server's CPU left out)",
    "echo": "bare aiortc echo peer (transport floor)",
    "livekit-echo": "bare livekit.rtc tone agent (LiveKit barge-in floor)",
}
#: The floors: no worker, nothing of this project's on their side of the call.
FLOORS = ("echo", "livekit-echo")


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


def native_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the process's threads that are not Python's: those a native library
    started and named (livekit's FFI: tokio, WebRTC's network, audio and encoder threads).
    Python threads keep the process's own name, the end-of-turn and VAD inference included."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            own = f.read().strip()
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    ticks = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name != own:
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
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


# ---------------------------------------------------------------- one round


@dataclass
class Round:
    path: str
    sessions: int
    serving: int = 0  # sessions the worker had open when the window began
    ready: bool = False
    window_s: float = float("nan")
    worker_cores: float = float("nan")
    native_cores: float = float("nan")  # of worker_cores, in threads a native library started
    end_of_turn_cores: float = float("nan")  # of worker_cores, the end-of-turn model's inferences
    server_cores: float = 0.0
    callers_cores: float = float("nan")
    loop_waited: float = float("nan")  # share of the window the worker's loop thread waited for a CPU
    machine_cores: float = float("nan")
    barge_in: dict[float, float] = field(default_factory=dict)  # the worker's histogram over the round
    interruptions: int = 0
    heard_stop_ms: list[float] = field(default_factory=list)
    reply_after_ms: list[float] = field(default_factory=list)
    underruns: int = 0
    end_of_turn_inferences: int = 0
    no_reply: int = 0
    caller_errors: list[str] = field(default_factory=list)
    note: str = ""
    took_s: float = 0.0
    profile: dict[str, float] = field(default_factory=dict)

    @property
    def barge_ins(self) -> int:
        return int(max(self.barge_in.values(), default=0))

    @property
    def complete(self) -> bool:
        """Every call was up and served through the window: only such rounds give figures per call."""
        return self.ready and self.serving == self.sessions

    def saturated(self, cores: int) -> bool:
        """The machine had no CPU to spare: calls then fall behind (fewer turns, later replies) and
        the worker does less than a call's share of work, so its figure per call reads low."""
        return self.machine_cores >= SATURATED * cores

    def measured(self, cores: int) -> bool:
        """Only such rounds go into the verdicts."""
        return self.complete and not self.saturated(cores)


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
                agent = "bench.livekit_worker" if kind(path) == "livekit" else "bench.livekit_echo_agent"
                command = [python, "-m", agent, "--metrics-port", str(port)]
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

    def measure_idle(self, seconds: float = 3.0) -> None:
        pids = {path: service.pid for path, service in self.workers.items()}
        before = {k: tree_cpu_s(pid) for k, pid in pids.items()}
        t0 = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - t0
        self.idle = {k: cpu_delta(before[k], tree_cpu_s(pid)) / wall for k, pid in pids.items()}

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
            eot0 = scrape(port)
            before = {k: tree_cpu_s(pid) for k, pid in pids.items()}
            native0 = native_thread_cpu_s(worker.pid)
            waited0 = run_queue_wait_s(worker.pid)
            busy0, t0 = all_cpu_s(), time.perf_counter()
            await asyncio.sleep(args.window)
            after = {k: tree_cpu_s(pid) for k, pid in pids.items()}
            native1 = native_thread_cpu_s(worker.pid)
            waited = run_queue_wait_s(worker.pid) - waited0
            busy1 = all_cpu_s()
            wall = time.perf_counter() - t0
            eot1 = scrape(port)
            if eot0 is not None and eot1 is not None:
                result.end_of_turn_cores = (eot1.end_of_turn_cpu_s - eot0.end_of_turn_cpu_s) / wall
            result.native_cores = (native1 - native0) / wall
            result.machine_cores = cpu_delta(busy0, busy1) / wall
            result.window_s = wall
            result.loop_waited = waited / wall
            result.worker_cores = cpu_delta(before["worker"], after["worker"]) / wall
            result.server_cores = cpu_delta(before["server"], after["server"]) / wall if "server" in pids else 0.0
            result.callers_cores = cpu_delta(before["callers"], after["callers"]) / wall
            if spy is not None:
                result.profile = await finish_profile(spy)
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
        if not await self._sessions_closed(path, 15.0):
            result.note = (result.note + "; " if result.note else "") + "sessions still open 15 s after the callers left"
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
            result.note = (result.note + "; " if result.note else "") + "callers printed no figures"
        result.took_s = time.perf_counter() - started
        return result


# ---------------------------------------------------------------- where the worker's time goes (py-spy)

#: py-spy samples every thread that is runnable, and a thread woken in a blocking call stays runnable
#: there until it gets a CPU: on a busy machine, that is much of what it records for the worker's loops.
#: Such samples (their innermost frame a blocking call) are a wait, not work, and count apart.
WAITING = "woken in a wait, not yet run (not work)"
WAIT_FRAME = re.compile(r"^(?:\w+\.)?(?:select|poll|wait|_wait_for_tstate_lock|acquire) \(.*"
                        r"(?:selectors|threading|asyncio/\w+|concurrent/futures/\w+)\.py")

#: Innermost match wins: a sample counts for the first part whose pattern its stack meets, leaf first.
#: py-spy names a frame "[Class.]function (path:line)"; libopus and soxr run inside the Python frame calling them.
PROFILE_PARTS = tuple((name, tuple(re.compile(p) for p in patterns)) for name, patterns in (
    ("Opus encode", (r"\brecv \(.*webrtc/direct/tracks\.py", r"\bencode \(.*codecs/opus\.py")),
    ("Opus decode", (r"\bdecoder_worker \(", r"\bput \(.*webrtc/direct/tracks\.py", r"\bdecode \(.*codecs/opus\.py")),
    ("Silero VAD (onnxruntime)", (r"onnxruntime", r"models/vad\.py")),
    ("end-of-turn model", (r"models/end_of_turn\.py",)),
    ("resampling (soxr)", (r"soxr", r"protocol/audio\.py")),
    ("RTP audio level (aiortc)", (r"\bcompute_audio_level_dbov",)),
    ("data channel (SCTP/DTLS)", (r"rtcsctptransport\.py", r"rtcdatachannel\.py")),
    ("RTP/SRTP send and receive", (r"rtcrtpsender\.py", r"rtcrtpreceiver\.py", r"rtcdtlstransport\.py",
                                   r"pylibsrtp", r"jitterbuffer\.py", r"aiortc/rtp\.py")),
    ("ICE/UDP", (r"aioice",)),
    ("livekit FFI events", (r"livekit/rtc/_ffi_client\.py", r"livekit/rtc/_utils\.py", r"livekit/ffi_audio\.py",
                            r"livekit/ffi_router\.py", r"livekit/rtc/audio_stream\.py", r"livekit/rtc/audio_source\.py")),
    ("livekit SDK (other)", (r"livekit/rtc/", r"livekit/agents/")),
    ("call audio path", (r"webrtc/media/",)),
    ("session runner + plugin", (r"agent/session/", r"plugins/")),
    ("asyncio loop and wake-ups", (r"asyncio/", r"selectors\.py")),
    ("threads (hand-offs)", (r"threading\.py", r"concurrent/futures")),
))


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the worker (all threads, native frames) for ``seconds``; None without py-spy."""
    import shutil

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    command = [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "200",
               "--format", "raw", "--nonblocking", "--output", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.out_path = out  # type: ignore[attr-defined]
    return proc


async def finish_profile(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    await asyncio.to_thread(proc.wait)
    out: Path = proc.out_path  # type: ignore[attr-defined]
    if not out.exists():
        return {}
    return profile_shares(out.read_text(errors="replace"))


def part_of(frames: list[str]) -> str:
    """The PROFILE_PARTS entry of a stack (outermost frame first): the innermost frame that names one."""
    for frame in reversed(frames):
        hit = next((name for name, patterns in PROFILE_PARTS if any(p.search(frame) for p in patterns)), None)
        if hit is not None:
            return hit
    return "other"


def profile_shares(collapsed: str) -> dict[str, float]:
    """Share of samples per PROFILE_PARTS entry from py-spy's raw (collapsed stacks) output."""
    counts: dict[str, float] = {}
    total = 0.0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = float(count_text)
        except ValueError:
            continue
        total += count
        frames = stack.split(";")
        part = WAITING if WAIT_FRAME.match(frames[-1]) else part_of(frames)
        counts[part] = counts.get(part, 0.0) + count
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}


# ---------------------------------------------------------------- report


def per_call(r: Round, idle: dict[str, float]) -> float:
    """% of a core per call: (the worker's cores - its idle cores) / calls it served."""
    return 100.0 * (r.worker_cores - idle.get(r.path, 0.0)) / max(1, r.serving or r.sessions)


def report(rig: Rig, rounds: list[Round], skipped: list[str]) -> None:
    idle = rig.idle
    cores = os.cpu_count() or 1
    print()
    print("idle, before any call (cores): " + ", ".join(f"{p} {idle[p]:.3f}" for p in rig.paths))
    print(f"CPU: psutil cpu_times deltas of each process over a {rig.args.window:.0f} s window while every call loops "
          "question -> ~300 ms of reply -> interruption + question ...; per call = (worker cores - its idle) / calls; "
          "of it native = the part in threads a native library started and named (livekit's FFI media: WebRTC, "
          "Opus, tokio), per call, its fixed cost included: what no change in this project's Python can remove; "
          "of it end-of-turn = the end-of-turn model's inferences, per call (the worker's "
          "duplex_end_of_turn_cpu_seconds over the window); "
          "loop waited = share of the window the worker's main thread was runnable but had no CPU (schedstat)")
    print()
    header = (f"{'path':16} | {'calls':>5} | {'worker cores':>12} | {'% core per call':>15} | {'of it native':>12} | "
              f"{'of it end-of-turn':>17} | "
              f"{'x echo floor':>12} | {'x control':>9} | {'loop waited':>11} | {'barge-in p50/p95 ms (n)':>23} | "
              f"{'underruns':>9}")
    print(header)
    print("-" * len(header))
    floor = {r.sessions: per_call(r, idle) for r in rounds if r.path == "echo"}
    control = {(kind(r.path), r.sessions): per_call(r, idle) for r in rounds if is_control(r.path)}
    for sessions in sorted({r.sessions for r in rounds}):
        for r in (r for r in rounds if r.sessions == sessions):
            per = per_call(r, idle)
            ratio = f"{per / floor[sessions]:.2f}" if sessions in floor and r.path != "echo" and floor[sessions] > 0 else "-"
            bi = (f"{histogram_quantile(r.barge_in, 50):.0f}/{histogram_quantile(r.barge_in, 95):.0f} ({r.barge_ins})"
                  if r.barge_ins else "-")
            count = f"{r.serving}" if r.serving == r.sessions else f"{r.serving}/{r.sessions}"
            notes = [r.note] if r.note else []
            if r.saturated(cores):
                notes.append(f"machine saturated: {r.machine_cores:.2f} of {cores} cores busy"
                             + (": left out of the verdicts below" if r.complete else ""))
            mine = control.get((kind(r.path), sessions)) if not is_control(r.path) else None
            versus = f"{per / mine:.2f}" if mine else "-"
            if r.loop_waited > STARVED:
                notes.append("the worker's loop was starved of CPU: it fell behind, so its figure is low")
            if not r.complete:
                notes.append("not every call was up: left out of the verdicts below")
            native = f"{100 * r.native_cores / max(1, r.serving or r.sessions):12.2f}" if r.native_cores > 0 else f"{'-':>12}"
            eot = (f"{100 * r.end_of_turn_cores / max(1, r.serving or r.sessions):17.2f}"
                   if r.end_of_turn_cores > 0 else f"{'-':>17}")
            print(f"{r.path:16} | {count:>5} | {r.worker_cores:12.3f} | {per:15.2f} | {native} | {eot} | {ratio:>12} | "
                  f"{versus:>9} | "
                  f"{100 * r.loop_waited:10.0f}% | {bi:>23} | "
                  f"{r.underruns if kind(r.path) not in FLOORS else '-':>9}" + (f"   [{'; '.join(notes)}]" if notes else ""))
    for line in skipped:
        print(f"(skipped {line})")
    print()
    print("per call at the largest N over per call at the smallest (linear: <= "
          f"{LINEAR_WITHIN:.1f}), and against the target:")
    for path in rig.paths:
        for r in (r for r in rounds if r.path == path and not r.measured(cores)):
            why = (f"{r.serving} of them served in the window ({r.note or 'callers not ready'})" if not r.complete
                   else f"the machine was saturated ({r.machine_cores:.2f} of {cores} cores busy), so the calls fell "
                        "behind and did less than their share")
            print(f"  {describe(path)}: {r.sessions} calls not measured: {why}: this machine could not run them all")
        mine = sorted((r for r in rounds if r.path == path and r.measured(cores)), key=lambda r: r.sessions)
        if not mine:
            continue
        small, large = mine[0], mine[-1]
        growth = per_call(large, idle) / per_call(small, idle) if per_call(small, idle) > 0 else float("nan")
        target = TARGET_PER_CALL.get(kind(path))
        verdict = ""
        if target is not None:
            verdict = (f"; {per_call(large, idle):.2f}% per call at {large.sessions} against a target of <= {target}%: "
                       f"{'met' if per_call(large, idle) <= target else 'NOT met'}")
            if large.end_of_turn_cores > 0:
                without = per_call(large, idle) - 100 * large.end_of_turn_cores / large.sessions
                verdict += (f"; without the end-of-turn model's inferences {without:.2f}%: "
                            f"{'met' if without <= target else 'NOT met'}")
        print(f"  {describe(path)}: {large.sessions} vs {small.sessions} calls: {growth:.2f}x "
              f"({'linear' if growth <= LINEAR_WITHIN else 'NOT linear'}){verdict}")
    print()
    print("context per round (cores over the same window): server = the loopback LiveKit server (left out of the "
          "worker's figure), callers = the callers' process, rest = everything else on the machine (other workers, "
          "this bench, unrelated processes); the callers' view: no reply within 12 s, onset sent -> the agent "
          "heard to stop, question's end sent -> reply heard (500 ms end-of-turn silence included); end-of-turn "
          "inferences = pauses the worker showed its end-of-turn model, per call per minute of the round (their CPU "
          "is the first table's 'of it end-of-turn')")
    header2 = (f"{'path':16} | {'calls':>5} | {'server':>6} | {'callers':>7} | {'rest':>5} | {'machine':>7} | "
               f"{'unanswered':>10} | {'heard stop p50 ms':>17} | {'reply heard p50 ms':>18} | "
               f"{'end-of-turn inferences':>22}")
    print(header2)
    print("-" * len(header2))
    for sessions in sorted({r.sessions for r in rounds}):
        for r in (r for r in rounds if r.sessions == sessions):
            rest = r.machine_cores - r.worker_cores - r.server_cores - r.callers_cores
            print(f"{r.path:16} | {r.sessions:>5} | {r.server_cores:6.2f} | {r.callers_cores:7.2f} | {rest:5.2f} | "
                  f"{r.machine_cores:7.2f} | {r.no_reply:>10} | "
                  f"{statistics.median(r.heard_stop_ms) if r.heard_stop_ms else float('nan'):17.0f} | "
                  f"{statistics.median(r.reply_after_ms) if r.reply_after_ms else float('nan'):18.0f} | "
                  f"{r.end_of_turn_inferences / r.sessions / (r.took_s / 60) if r.took_s else float('nan'):22.1f}")
    pooled = {path: [r for r in rounds if r.path == path and r.barge_ins and r.measured(cores)] for path in rig.paths}
    for path, mine in pooled.items():
        if not mine:
            continue
        buckets: dict[float, float] = {}
        for r in mine:
            for le, count in r.barge_in.items():
                buckets[le] = buckets.get(le, 0.0) + count
        at_80 = buckets.get(80.0, 0.0) / max(1.0, max(buckets.values()))
        print(f"barge-in at the {path} worker, all measured rounds (its /metrics histogram, interpolated): "
              f"p50 {histogram_quantile(buckets, 50):.0f} ms, p95 {histogram_quantile(buckets, 95):.0f} ms, "
              f"{100 * at_80:.0f}% within 80 ms (n={int(max(buckets.values()))}); the callers heard it stop "
              f"{summary([v for r in mine for v in r.heard_stop_ms], 'ms')}")
    report_barge_in_floor(rounds, cores)
    profiled = [r for r in rounds if r.profile]
    if profiled:
        print()
        print("where the worker's time goes (py-spy, all threads, share of samples; innermost part named wins; "
              f"'{WAITING}' = a thread woken in a blocking call, runnable but without a CPU yet):")
        parts = sorted({k for r in profiled for k in r.profile}, key=lambda k: -max(r.profile.get(k, 0) for r in profiled))
        print(f"  {'part':44}" + "".join(f" | {r.path + ' ' + str(r.sessions):>11}" for r in profiled))
        for part in parts:
            print(f"  {part:44}" + "".join(f" | {100 * r.profile.get(part, 0.0):10.1f}%" for r in profiled))
    errors = [(r.path, r.sessions, e) for r in rounds for e in r.caller_errors]
    if errors:
        print(f"caller errors: {errors[:5]}")
    print()
    print(f"notes: every process shares this machine's {cores} cores, and other developers' jobs ran beside these "
          "rounds ('rest'): compare the paths within one run (same N, same window), not across runs. The loopback "
          "LiveKit server is a Python SFU (aiortc) that forwards Opus RTP untouched as it arrives, as LiveKit's "
          "does (no jitter buffer, no hold), at Python's cost per packet.")


def report_barge_in_floor(rounds: list[Round], cores: int) -> None:
    """Barge-in as the LiveKit callers heard it (onset sent -> the agent heard to stop), the worker against
    the bare livekit.rtc agent through the same server in the same run, per call count."""
    for sessions in sorted({r.sessions for r in rounds}):
        mine = [r for r in rounds if r.sessions == sessions and kind(r.path) in ("livekit", "livekit-echo")
                and r.complete]
        heard = {p: [v for r in mine if kind(r.path) == p for v in r.heard_stop_ms] for p in ("livekit", "livekit-echo")}
        if not heard["livekit"] or not heard["livekit-echo"]:
            continue
        ours, floor = (np.percentile(heard[p], [50, 95]) for p in ("livekit", "livekit-echo"))
        saturated = sum(r.saturated(cores) for r in mine)
        print(f"LiveKit barge-in as the caller hears it, {sessions} calls: ours p50 {ours[0]:.0f} / p95 {ours[1]:.0f} ms "
              f"(n={len(heard['livekit'])}), the bare livekit.rtc agent (floor) p50 {floor[0]:.0f} / p95 "
              f"{floor[1]:.0f} ms (n={len(heard['livekit-echo'])}): ours beyond the floor p50 {ours[0] - floor[0]:+.0f} "
              f"ms, p95 {ours[1] - floor[1]:+.0f} ms"
              + (f" [the machine was saturated in {saturated} of these {len(mine)} rounds]" if saturated else ""))


# ---------------------------------------------------------------- main


def write_speech(path: str) -> None:
    from bench.livekit_callers import INTERRUPTIONS, QUESTIONS, SAMPLE_RATE
    from devtools.speech import speak

    speech = {f"q{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(QUESTIONS)}
    speech.update({f"i{i}": speak(text, SAMPLE_RATE) for i, text in enumerate(INTERRUPTIONS)})
    np.savez(path, **speech)


async def run(rig: Rig) -> None:
    args = rig.args
    started = time.perf_counter()
    rounds: list[Round] = []
    skipped: list[str] = []
    for sessions in args.session_counts:
        elapsed = time.perf_counter() - started
        # The next N takes at least as long as the last one did, every path together.
        if rounds and elapsed + sum(r.took_s for r in rounds[-len(rig.paths):]) > args.budget:
            skipped.append(f"{sessions} calls: the run's time budget of {args.budget:.0f} s was spent")
            continue
        for path in rig.paths:
            want = 0 if path == "echo" else args.round_trials[sessions]
            result = await rig.round(path, sessions, want, profile=args.profile and sessions == args.profile_at)
            rounds.append(result)
            print(f"   ... {path:16} {sessions:2d} calls: worker {result.worker_cores:.3f} cores "
                  f"({per_call(result, rig.idle):.2f}% per call), {result.barge_ins} barge-ins, "
                  f"{result.took_s:.0f} s" + (f" [{result.note}]" if result.note else ""), flush=True)
    report(rig, rounds, skipped)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def parse_args(description: str, extra: list[tuple[str, dict[str, Any]]] = ()) -> argparse.Namespace:
    """The rounds' options (and a bench's own ``extra`` ones)."""
    parser = argparse.ArgumentParser(description=description)
    for flag, options in extra:
        parser.add_argument(flag, **options)
    # Left unset, these take the full run's values, or --quick's.
    parser.add_argument("--sessions", help="simultaneous calls per round, per path (4,8,16; quick: 4,16)")
    parser.add_argument("--window", type=float, help="steady CPU window per round, seconds (8; quick: 5)")
    parser.add_argument("--warmup", type=float, help="seconds after every caller hears the agent (2; quick: 1.5)")
    parser.add_argument("--trials", help="interruptions each round waits for, by --sessions entry (8,4,2; quick: 4,0)")
    parser.add_argument("--round-limit", type=float, default=90.0, help="most seconds of one round")
    parser.add_argument("--trial-wait", type=float,
                        help="most seconds a round waits for its interruptions after the CPU window (20; quick: 10)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="skip the larger call counts when the rounds would run past this many seconds")
    parser.add_argument("--profile", action="store_true", help="sample the worker with py-spy in one round per path")
    parser.add_argument("--profile-at", type=int, default=8, help="the call count whose rounds --profile samples")
    parser.add_argument("--quick", action="store_true",
                        help="4 and 16 calls, 5 s windows, few interruptions: a few minutes on a quiet machine")
    parser.add_argument("--control", default="", metavar="CHECKOUT",
                        help="also run each worker from this checkout (its .venv), round for round: an A/B in one run")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their folder is printed)")
    args = parser.parse_args()
    full = {"sessions": "4,8,16", "window": 8.0, "warmup": 2.0, "trials": "8,4,2", "trial_wait": 20.0}
    quick = {"sessions": "4,16", "window": 5.0, "warmup": 1.5, "trials": "4,0", "trial_wait": 10.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.session_counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    trials = [int(n) for n in args.trials.split(",") if n.strip()]
    args.round_trials = {n: trials[i] if i < len(trials) else (trials[-1] if trials else 0)
                         for i, n in enumerate(args.session_counts)}
    if args.profile and args.profile_at not in args.session_counts:
        args.profile_at = args.session_counts[len(args.session_counts) // 2]
    return args


def main(paths: tuple[str, ...], title: str, description: str = "", *, args: argparse.Namespace | None = None) -> int:
    args = args or parse_args(description)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"== duplex-agent: {title} (python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start) ==", flush=True)
    started = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-calls-"))
    if args.control:
        paths = tuple(p for path in paths for p in ((path, path + CONTROL) if kind(path) not in FLOORS else (path,)))
    rig = Rig(args, paths, log_dir)
    children_take_sigint()
    signal.signal(signal.SIGTERM, _interrupt)  # unwind through the finally below: every process stops
    status = 0
    try:
        write_speech(rig.speech_file)
        rig.start()
        print("   " + ", ".join(f"{describe(p)}: pid {rig.workers[p].pid}" for p in rig.paths)
              + f"; scripted plugin; set-up {time.perf_counter() - started:.0f} s", flush=True)
        rig.measure_idle()
        asyncio.run(run(rig))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception as exc:
        print(f"the rounds failed: {exc!r}", file=sys.stderr)
        status = 1
    finally:
        rig.stop()
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

