"""New calls refused while the machine's CPU is saturated, so the calls already up keep their share.

A live call needs the CPU on time, every frame: a worker that takes one more call than the machine
can run makes every call late (the agent's voice underruns, barge-in slows), not only the new one.
With ``--max-cpu`` set, the busy share of the machine's CPUs over the last ``WINDOW_S`` decides:
above it, a direct offer is answered 503 ``overloaded`` with ``Retry-After``, a realtime websocket's
first ``session.update`` gets the same error, and a LiveKit worker reports itself full, so LiveKit's
dispatch gives the job to another worker. The share is the whole machine's (``/proc/stat``), not
this process's: a model server or another worker on the same host takes from the same cores.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from duplex_agent.agent import metrics
from duplex_agent.agent.session.ports import AdmissionError

#: The span the busy share is measured over: long enough that a burst (a model loading, a
#: collection) does not refuse calls, short enough that a saturated machine is seen in seconds.
WINDOW_S = 5.0
SAMPLE_S = 0.5
#: What a refused client is told to wait: about the window, after which the share is new.
RETRY_AFTER_S = 5
PROC_STAT = Path("/proc/stat")

CpuTimes = tuple[int, int]  # busy and total clock ticks of all the machine's CPUs since boot


class CpuOverloaded(AdmissionError):
    def __init__(self, busy: float, limit: float) -> None:
        super().__init__(f"the machine's CPUs are {busy:.0%} busy over the last {WINDOW_S:g} s, above "
                         f"--max-cpu {limit:.0%}; try again later", code="overloaded", retry_after_s=RETRY_AFTER_S)


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes:
    """Busy and total ticks of all CPUs, from /proc/stat's ``cpu`` line (idle and iowait are not busy;
    guest time is already inside user time, so only the first eight fields count)."""
    fields = path.read_text().split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"{path} does not start with the machine's cpu line")
    ticks = [int(value) for value in fields[1:9]]
    total = sum(ticks)
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return total - idle, total


class CpuMeter:
    """The busy share of the machine's CPUs over about the last ``window_s``, from counter samples."""

    def __init__(self, read: Callable[[], CpuTimes] = read_cpu_times, window_s: float = WINDOW_S) -> None:
        self._read = read
        self.window_s = window_s
        self._samples: deque[tuple[float, int, int]] = deque()
        self._lock = threading.Lock()

    def sample(self, now: float) -> None:
        busy, total = self._read()
        with self._lock:
            self._samples.append((now, busy, total))
            # keep the newest sample at least window_s old, so the share always spans the window
            while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
                self._samples.popleft()

    def busy_share(self) -> float | None:
        """None until two samples span some CPU time."""
        with self._lock:
            if len(self._samples) < 2:
                return None
            (_, busy0, total0), (_, busy1, total1) = self._samples[0], self._samples[-1]
        ticks = total1 - total0
        return (busy1 - busy0) / ticks if ticks > 0 else None


class CpuGuard:
    """``max_share`` 0: never refuses (no sampling either)."""

    def __init__(self, max_share: float, meter: CpuMeter | None = None) -> None:
        if not 0.0 <= max_share <= 1.0:
            raise ValueError(f"--max-cpu must be a share between 0 (off) and 1, not {max_share!r}")
        self.max_share = max_share
        self.meter = meter or CpuMeter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.max_share > 0.0

    def start(self) -> None:
        """Sample on a thread of its own: the share must be current when the loops are the busy ones."""
        if not self.enabled or self._thread is not None:
            return
        self.meter.sample(time.monotonic())
        self._thread = threading.Thread(target=self._run, name="cpu-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * SAMPLE_S)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.meter.sample(time.monotonic())
            busy = self.meter.busy_share()
            if busy is not None:
                metrics.MACHINE_CPU_BUSY.set(busy)

    def load(self) -> float:
        """The busy share against the limit (1.0: at it), 0 when off or not measured yet."""
        busy = self.meter.busy_share() if self.enabled else None
        return 0.0 if busy is None else busy / self.max_share

    def check(self) -> None:
        """CpuOverloaded while the machine is busier than the limit."""
        busy = self.meter.busy_share() if self.enabled else None
        if busy is not None and busy > self.max_share:
            raise CpuOverloaded(busy, self.max_share)
