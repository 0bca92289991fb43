"""The CPU guard on a virtual clock: the machine's busy share over its window, and what it refuses."""

from __future__ import annotations

import pytest

from duplex_agent.agent.app import livekit_worker as worker
from duplex_agent.agent.session.cpu_guard import RETRY_AFTER_S, CpuGuard, CpuMeter, CpuOverloaded, read_cpu_times
from tests.support.cpu import ScriptedCpu
from tests.support.waits import until


def test_proc_stat_busy_leaves_out_idle_and_iowait(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 10 50 800 40 0 5 5 30 0\ncpu0 50 5 25 400 20 0 2 3 15 0\n")
    assert read_cpu_times(stat) == (170, 1010)
    stat.write_text("intr 1 2 3\n")
    with pytest.raises(ValueError, match="cpu line"):
        read_cpu_times(stat)


def test_the_share_is_the_last_windows_not_since_start():
    cpu = ScriptedCpu()
    meter = CpuMeter(cpu.read, window_s=5.0)
    assert meter.busy_share() is None  # nothing measured yet
    cpu.run(meter, 20.0, 1.0)
    assert meter.busy_share() == pytest.approx(1.0)
    cpu.run(meter, 2.0, 0.0)
    assert meter.busy_share() == pytest.approx(0.6, abs=0.05)  # 3 of the last 5 s busy
    cpu.run(meter, 6.0, 0.0)
    assert meter.busy_share() == pytest.approx(0.0)  # the busy minutes are forgotten


def test_a_saturated_machine_refuses_with_a_code_and_when_to_retry():
    cpu = ScriptedCpu()
    guard = CpuGuard(0.9, cpu.meter())
    guard.check()  # unmeasured: admits
    cpu.run(guard.meter, 6.0, 0.5)
    guard.check()
    assert guard.load() == pytest.approx(0.5 / 0.9)
    cpu.run(guard.meter, 6.0, 0.97)
    with pytest.raises(CpuOverloaded, match="97% busy") as refused:
        guard.check()
    assert refused.value.code == "overloaded"
    assert refused.value.retry_after_s == RETRY_AFTER_S
    assert guard.load() > 1.0
    cpu.run(guard.meter, 6.0, 0.3)
    guard.check()  # the burst passed: admits again


def test_off_never_refuses_and_reports_no_load():
    cpu = ScriptedCpu()
    guard = CpuGuard(0.0, cpu.meter())
    cpu.run(guard.meter, 6.0, 1.0)
    guard.check()
    assert guard.load() == 0.0
    guard.start()  # off: no sampling thread either
    assert guard._thread is None


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused_at_start(share):
    with pytest.raises(ValueError, match="--max-cpu"):
        CpuGuard(share)


async def test_the_guard_samples_the_real_machine_on_its_own_thread():
    guard = CpuGuard(1.0)
    guard.start()
    try:
        await until(lambda: guard.meter.busy_share() is not None, 10, "the guard's second sample")
        assert 0.0 <= guard.meter.busy_share() <= 1.0
    finally:
        guard.stop()
    assert guard._thread is None


class SlotsBackend:
    active_sessions = 1
    server_free_sessions = None


def test_a_livekit_worker_is_full_while_the_machine_is_saturated():
    cpu = ScriptedCpu()
    guard = CpuGuard(0.8, cpu.meter())
    cpu.run(guard.meter, 6.0, 0.2)
    assert worker.worker_load(SlotsBackend(), worker.LiveCalls(), 4, guard) == pytest.approx(0.25)  # the slots say
    cpu.run(guard.meter, 6.0, 0.6)
    assert worker.worker_load(SlotsBackend(), worker.LiveCalls(), 4, guard) == pytest.approx(0.75)  # the CPU says
    cpu.run(guard.meter, 6.0, 0.95)
    assert worker.worker_load(SlotsBackend(), worker.LiveCalls(), 4, guard) == 1.0  # full: no job is sent here
