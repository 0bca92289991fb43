"""What the call rounds measured: one round's figures, a whole run's, and the arithmetic on them.

Filled in by the rig (``bench.call_rig``), judged by the report (``bench.call_report``); nothing
here starts a process or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A path run from the ``--control`` checkout is named with this suffix ("direct@control").
CONTROL = "@control"
#: A worker's loop thread that waited for a CPU this share of the window could not keep up.
STARVED = 0.25
#: A round with the machine this busy (share of its cores) is saturated.
SATURATED = 0.9


def kind(path: str) -> str:
    """direct, livekit, echo or livekit-echo: what a path is, whichever checkout runs it."""
    return path.removesuffix(CONTROL)


#: The floors: no worker, nothing of this project's on their side of the call.
FLOORS = ("echo", "livekit-echo")


def over_livekit(path: str) -> bool:
    return kind(path) in ("livekit", "livekit-echo")


def is_control(path: str) -> bool:
    return path.endswith(CONTROL)


@dataclass
class Round:
    """What one round of N simultaneous calls on one path measured."""

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

    def add_note(self, note: str) -> None:
        self.note = f"{self.note}; {note}" if self.note else note

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

    @property
    def starved(self) -> bool:
        """The worker's loop fell behind for want of a CPU, so its figure reads low."""
        return self.loop_waited > STARVED

    def measured(self, cores: int) -> bool:
        """Only such rounds go into the verdicts."""
        return self.complete and not self.saturated(cores)


@dataclass
class Run:
    """A whole run: every round, each path's idle cores, and what the machine was."""

    paths: tuple[str, ...]
    window_s: float  # the configured CPU window per round
    cores: int  # of the machine every process shared
    idle: dict[str, float] = field(default_factory=dict)  # each worker's cores before any call
    rounds: list[Round] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # call counts not run, and why


def per_call(r: Round, idle: dict[str, float]) -> float:
    """% of a core per call: (the worker's cores - its idle cores) / calls it served."""
    return 100.0 * (r.worker_cores - idle.get(r.path, 0.0)) / max(1, r.serving or r.sessions)
