"""A whole call across an ImpairedLink: the worker (``duplex-agent serve``) in the worker's
namespace, the caller program (``devtools.netem.caller``) in the caller's, and how what the
worker's recognizer heard is scored against what the caller said."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import IO

import numpy as np

from devtools.netem.link import ImpairedLink
from devtools.speech import words

ROOT = Path(__file__).resolve().parents[2]
WORKER_PORT = 8090
SFU_PORT = 7880
LIVEKIT_AGENT = "netem-agent"
LIVEKIT_KEY, LIVEKIT_SECRET = "devkey", "netem-loopback-secret-0123456789abcdef"
#: The worker's program: the CLI (a bench may name a module that runs it with a variant installed).
WORKER_MODULE = "duplex_agent.agent.app.cli"
#: The LiveKit worker's model: the reference model, replying with what it heard.
REFERENCE_WORKER = ("--plugin", "reference", "--responder", "echo", "--max-sessions", "2")
_NUMBERS = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six",
            "7": "seven", "8": "eight", "9": "nine", "10": "ten"}
_FUNCTION_WORDS = set(["a", "an", "the", "to", "for", "of", "and", "or", "in", "on", "at", "is", "are", "am", "be", "i", "me", "my", "you", "your", "we", "our", "it", "that", "this", "please", "would", "like", "about", "whether", "with"])


def content_words(text: str) -> list[str]:
    """The words that carry the meaning: lower case, digits spelled out, function words dropped."""
    found = (_NUMBERS.get(w, w) for w in words(text))
    return [w for w in found if w not in _FUNCTION_WORDS]


def recall(said: str, heard: str) -> float:
    """The share of ``said``'s content words that appear in ``heard``."""
    wanted, got = content_words(said), set(content_words(heard))
    return sum(w in got for w in wanted) / len(wanted) if wanted else 1.0


def recall_of_turns(said: list[str], heard: list[str]) -> tuple[float, int]:
    """The share of the content words of all ``said`` turns found in all ``heard`` ones, each heard
    word matched to one said (the turns repeat words), and how many words were said."""
    wanted = Counter(w for text in said for w in content_words(text))
    got = Counter(w for text in heard for w in content_words(text))
    total = sum(wanted.values())
    return (sum(min(n, got[w]) for w, n in wanted.items()) / total if total else 1.0), total


def write_clips(folder: Path, question: np.ndarray, long: np.ndarray, stop: np.ndarray) -> Path:
    """The caller's three clips (48 kHz float32) as the .npy files it reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, audio in (("question", question), ("long", long), ("stop", stop)):
        np.save(folder / f"{name}.npy", audio.astype(np.float32))
    return folder


def environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment for a program of this tree: offline, the repository importable."""
    env = {k: v for k, v in os.environ.items() if k != "DUPLEX_API_KEY"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p))
    env.update(extra)
    return env


def start_worker(link: ImpairedLink, log: IO[str], env: dict[str, str] | None = None,
                 *flags: str, module: str = WORKER_MODULE) -> subprocess.Popen:
    """The embedded worker (reference model, echo responder) in the worker's namespace, serving
    on its address there; its output goes to ``log``. The link ends it when it closes."""
    address = link.address["worker"]
    command = [*link.exec_prefix("worker"), sys.executable, "-m", module, "serve",
               "--host", address, "--port", str(WORKER_PORT), "--plugin", "reference", "--responder", "echo",
               "--ice-address", address, "--allow-unauthenticated", *flags]
    return subprocess.Popen(command, env=environment(env or {}), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def worker_url(link: ImpairedLink) -> str:
    return f"http://{link.address['worker']}:{WORKER_PORT}"


class CallerStepFailed(RuntimeError):
    pass


class CallerProcess:
    """The caller program in the caller's namespace, sending its voice as ``sender`` says
    (``devtools.netem.caller.SENDERS``); ``step(cmd)`` sends one command and returns its JSON
    answer (raising on a missing answer, not on ``ok: false``)."""

    def __init__(self, link: ImpairedLink, clips: Path, log: IO[str], sender: str = "libopus-rr") -> None:
        command = [*link.exec_prefix("caller"), sys.executable, "-m", "devtools.netem.caller",
                   "--url", worker_url(link), "--ice-address", link.address["caller"], "--clips", str(clips),
                   "--sender", sender]
        self._proc = subprocess.Popen(command, env=environment({}), cwd=ROOT, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="netem-caller-out").start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("{"):
                self._answers.put(line)
        self._answers.put("")

    def step(self, cmd: str, timeout: float = 360) -> dict:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"cmd": cmd}) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise CallerStepFailed(f"the caller did not answer {cmd!r} in {timeout:.0f} s") from None
        if not line:
            raise CallerStepFailed(f"the caller exited ({self._proc.poll()}) before answering {cmd!r}")
        return json.loads(line)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> CallerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_livekit(link: ImpairedLink, sfu_log: IO[str], worker_log: IO[str], *server_flags: str,
                  worker_flags: tuple[str, ...] = REFERENCE_WORKER) -> str:
    """The loopback LiveKit server and a LiveKit worker (``duplex-agent start``; by default the
    reference model with the echo responder) in the worker's namespace; the server's URL
    (``server_flags``: more of the server's command line). The worker reaches the server inside
    that namespace (unimpaired); only a caller in the caller's namespace crosses the link. The
    link ends both when it closes."""
    address = link.address["worker"]
    sfu = subprocess.Popen([*link.exec_prefix("worker"), sys.executable, "-m", "devtools.livekit_server",
                            "--host", address, "--port", str(SFU_PORT), "--advertise-ip", address,
                            "--print-url", *server_flags],
                           env=environment({"LIVEKIT_API_KEY": LIVEKIT_KEY, "LIVEKIT_API_SECRET": LIVEKIT_SECRET}), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=sfu_log, text=True)
    assert sfu.stdout is not None
    url = sfu.stdout.readline().strip()
    if not url.startswith("ws://"):
        raise RuntimeError(f"the loopback LiveKit server did not start (exit {sfu.poll()})")
    env = environment({"LIVEKIT_URL": url, "LIVEKIT_API_KEY": LIVEKIT_KEY, "LIVEKIT_API_SECRET": LIVEKIT_SECRET,
                       # the reference model on a loaded 2-core machine can take seconds per sentence
                       "DUPLEX_BACKEND_STALL_TIMEOUT": "20"})
    subprocess.Popen([*link.exec_prefix("worker"), sys.executable, "-m", "duplex_agent.agent.app.cli", "start",
                      "--agent-name", LIVEKIT_AGENT, *worker_flags],
                     env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=worker_log, stderr=subprocess.STDOUT)
    return url


def livekit_callers(link: ImpairedLink, url: str, seconds: float, log: IO[str], *flags: str,
                    sessions: int = 1) -> dict:
    """``bench.livekit_callers`` (``sessions`` callers on the real livekit SDK, a room each,
    barging in again and again) in the caller's namespace for ``seconds`` (``flags``: more of its
    command line); its final JSON figures."""
    command = [*link.exec_prefix("caller"), sys.executable, "-m", "bench.livekit_callers", "--transport", "livekit",
               "--url", url, "--agent-name", LIVEKIT_AGENT,
               "--sessions", str(sessions), "--seconds", str(seconds), "--ignore-stdin", *flags]
    # The credentials travel in the environment: a command line is visible in ps.
    done = subprocess.run(command, env=environment({"LIVEKIT_API_KEY": LIVEKIT_KEY, "LIVEKIT_API_SECRET": LIVEKIT_SECRET}), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=log, text=True, timeout=seconds + 120)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    final = [line for line in lines if line.get("event") == "done"]
    if not final:
        raise RuntimeError(f"bench.livekit_callers ended ({done.returncode}) without its figures")
    return final[0]


_CALL_FIGURE = re.compile(r'^duplex_receive_call_(\w+)\{call="[^"]*",(?:outcome|event|stat)="(\w+)"\} (\S+)$')


def receive_figures(link: ImpairedLink) -> dict[str, float]:
    """The worker's receive-buffer figures of its live call (the adaptive buffer's per-call gauges of
    /metrics: ``frames_received``, ``packets_late``, ``delay_ms_p95``, ...); empty when it has none."""
    fetch = ("import sys, urllib.request; "
             "sys.stdout.write(urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=20).read().decode())")
    done = subprocess.run([*link.exec_prefix("worker"), sys.executable, "-c", fetch, worker_url(link)],
                          capture_output=True, text=True, timeout=60)
    figures = {}
    for text in done.stdout.splitlines():
        if match := _CALL_FIGURE.match(text):
            figures[f"{match[1]}_{match[2]}"] = float(match[3])
    return figures
