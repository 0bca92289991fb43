"""The soak's processes: the loopback LiveKit server and the workers under test, each its own process.

- ``direct``: ``duplex-agent serve`` (direct WebRTC callers), with the soak's tool-calling model and
  a tool module, so every turn runs a tool at the edge;
- ``livekit``: the LiveKit worker (``duplex-agent start --metrics-port``), the same model and tools;
- ``agents``: a LiveKit Agents app (``bench/livekit_agents_app.py``, ``ours``: AgentSession with our
  DuplexModel) and ``agents-backend``, the ``duplex-agent serve`` its DuplexModel talks to over the
  realtime websocket (plain scripted tones: a websocket client runs its own tools, and the app has none).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.call_rig import Service, free_port, start_loopback_server, wait_for_metrics
from bench.soak_calls import Target

MODEL = "bench.soak_plugin.ToolScripted"
TOOLS = "tests.tools.weather_tools"
LIVEKIT_AGENT = "soak-agent"
AGENTS_APP_AGENT = "duplex-bargein-bench"  # bench/livekit_agents_app.py's
KINDS = ("direct", "livekit", "agents")


@dataclass
class Worker:
    name: str
    service: Service
    metrics_port: int | None  # None: read from outside (psutil)
    serves: str  # the kind of call whose count its growth is measured against


class SoakRig:
    def __init__(self, log_dir: Path, kinds: tuple[str, ...], capacity: int) -> None:
        self.log_dir = log_dir
        self.kinds = kinds
        self.capacity = str(capacity)
        self.server: Service | None = None
        self.workers: list[Worker] = []
        self.targets: list[Target] = []

    def _serve(self, name: str, serves: str, *extra: str) -> Worker:
        port = free_port()
        command = [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--max-sessions", self.capacity,
                   "--host", "127.0.0.1", "--port", str(port), *extra]
        worker = Worker(name, Service(name, command, self.log_dir / f"{name}.log"), port, serves)
        self.workers.append(worker)
        return worker

    def start(self) -> None:
        from duplex_agent.webrtc.direct.host_address import interface_ipv4

        host = interface_ipv4()  # media needs ICE on a real interface; only this machine's address
        livekit_url = ""
        if {"livekit", "agents"} & set(self.kinds):
            self.server, livekit_url = start_loopback_server(self.log_dir, host)
        if "direct" in self.kinds:
            worker = self._serve("direct", "direct", "--plugin", MODEL, "--tools", TOOLS)
            self.targets.append(Target("direct", "direct", f"http://127.0.0.1:{worker.metrics_port}", resumes=True))
        if "livekit" in self.kinds:
            port = free_port()
            env = {"DUPLEX_PLUGIN": MODEL, "DUPLEX_TOOLS": TOOLS, "DUPLEX_MAX_SESSIONS": self.capacity,
                   "LIVEKIT_URL": livekit_url, "DUPLEX_AGENT_NAME": LIVEKIT_AGENT}
            self.workers.append(Worker("livekit", Service("livekit", [sys.executable, "-m", "duplex_agent.agent.app.cli",
                                                                      "start", "--metrics-port", str(port)],
                                                          self.log_dir / "livekit.log", env), port, "livekit"))
            self.targets.append(Target("livekit", "livekit", livekit_url, LIVEKIT_AGENT))
        if "agents" in self.kinds:
            backend = self._serve("agents-backend", "agents", "--plugin", "scripted")
            env = {"LIVEKIT_URL": livekit_url, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                   "BENCH_BACKEND_URL": f"ws://127.0.0.1:{backend.metrics_port}/v1/realtime?duplex=1",
                   "BENCH_RECORD": str(self.log_dir / "agents-record.jsonl")}
            app = Path(__file__).with_name("livekit_agents_app.py")
            self.workers.append(Worker("agents", Service("agents", [sys.executable, str(app), "start"],
                                                         self.log_dir / "agents.log", env), None, "agents"))
            self.targets.append(Target("agents", "livekit", livekit_url, AGENTS_APP_AGENT, metadata="ours"))
        for worker in self.workers:
            worker.service.start()
        for worker in self.workers:
            if worker.metrics_port is not None:
                wait_for_metrics(worker.service, worker.metrics_port, 120)
            else:
                wait_for_log(worker.service, re.compile(r"registered worker", re.I), 120)

    def stop(self) -> None:
        for worker in self.workers:
            worker.service.stop()
        if self.server is not None:
            self.server.stop()


def wait_for_log(service: Service, pattern: re.Pattern[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.tail()}")
        if pattern.search(service.log_path.read_text(errors="replace")):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{service.name} did not log {pattern.pattern!r} in {timeout:.0f} s:\n{service.tail()}")
