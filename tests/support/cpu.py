"""The machine's CPU counters as a test sets them, for a ``CpuMeter`` on a virtual clock."""

from __future__ import annotations

from duplex_agent.agent.session.cpu_guard import CpuMeter


class ScriptedCpu:
    """/proc/stat's busy and total ticks: ``run(meter, seconds, share)`` has the machine ``share``
    busy for ``seconds``, sampled every half second as the guard's thread samples it."""

    def __init__(self, ticks_per_s: int = 200) -> None:
        self.ticks_per_s = ticks_per_s
        self.busy = self.total = 0
        self.now = 0.0

    def read(self) -> tuple[int, int]:
        return self.busy, self.total

    def meter(self) -> CpuMeter:
        return CpuMeter(self.read)

    def run(self, meter: CpuMeter, seconds: float, share: float, step_s: float = 0.5) -> None:
        for _ in range(round(seconds / step_s)):
            ticks = round(self.ticks_per_s * step_s)
            self.busy += round(ticks * share)
            self.total += ticks
            self.now += step_s
            meter.sample(self.now)
