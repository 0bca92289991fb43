"""Four direct calls beside three CPU hogs for a minute: no call ends, every turn gets a reply, barge-in holds.

The worker (``serve``, the scripted model with a thirty-second reply to each turn) and four callers
(``bench.livekit_callers --transport direct``, one process each, as four browsers would be: a question,
~300 ms of the reply heard, an interruption running on into the next question, and so on) run beside
three ``yes`` processes, so the scheduler starves every loop, the callers' as much as the worker's. The
callers keep ICE consent as a browser does (RFC 7675's 30 s); the worker's is ``webrtc.direct.ice_consent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from pathlib import Path

from bench.call_rig import write_speech
from bench.caller_process import CallerProcess
from tests.integration.long_reply import REPLY_MS
from tests.serve_process import ServeProcess, environment
from tests.support.waits import until

CALLS = 4
HOGS = 3
SOAK_S = 60.0
#: Reasons a call can end for on the worker's side that this test must not see.
ENDINGS = ("consent_expired", "consent_revoked", "media_timeout")


def pin_to(cpu: int, pid: int) -> None:
    """Every thread of process ``pid`` on ``cpu`` alone (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), {cpu})


def errors_counted(metrics: str, code: str) -> float:
    match = re.search(rf'^duplex_errors_total\{{code="{code}"\}} (\S+)$', metrics, re.M)
    return float(match[1]) if match else 0.0


def counted(metrics: str, name: str) -> float:
    match = re.search(rf'^{name} (\S+)$', metrics, re.M)
    return float(match[1]) if match else 0.0


async def test_four_direct_calls_beside_three_cpu_hogs_for_a_minute(tmp_path):
    speech = tmp_path / "speech.npz"
    await asyncio.to_thread(write_speech, str(speech))  # Piper's work done before the hogs start
    worker = ServeProcess(tmp_path / "worker.log", "--plugin", "tests.integration.long_reply.LongReplyPlugin",
                          "--max-sessions", str(2 * CALLS))
    callers = [CallerProcess(worker.http, speech, SOAK_S + 600, extra=("--reply-ms", str(REPLY_MS)),
                             env=environment(), stderr=tmp_path / f"caller-{i}.log") for i in range(CALLS)]
    hogs: list[subprocess.Popen] = []
    summaries: list[dict | None] = []
    health: dict | None = None
    metrics, judged = "", 0
    try:
        worker.start()
        await worker.ready()
        await asyncio.gather(*(caller.start() for caller in callers))
        await until(lambda: all(c.event("ready") or c.event("not_ready") for c in callers), 120,
                    "the callers to connect and hear the agent")
        assert all(c.event("ready") for c in callers), ([c.lines[:1] for c in callers], worker.report())
        # The hogs hold one core whole (the worker and the callers share what is left with whatever else
        # runs), so a parallel test run is not starved along with them.
        cpu = max(os.sched_getaffinity(0))
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(HOGS)]
        for hog in hogs:
            pin_to(cpu, hog.pid)
        load_before = os.getloadavg()[0]
        await asyncio.sleep(SOAK_S)  # the soak itself: the minute is what is tested, not a wait for a signal
        print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} with {HOGS} hogs")
        health, metrics = await worker.health(), await worker.metrics()
        judged = sum((c.progress() or {}).get("attempts", 0) for c in callers)
        # What the worker's receive buffers and barge-in edge did meanwhile, to explain a failure.
        print("\n".join(line for line in metrics.splitlines()
                        if line.startswith(("duplex_receive_call_", "duplex_barge_in", "duplex_playout_underruns"))))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        summaries = [(called or [None])[0] for called in await asyncio.gather(*(c.hang_up() for c in callers))]
        await worker.stop()
    for caller in summaries:
        assert caller is not None, worker.report()
        print({k: caller[k] for k in ("attempts", "no_reply", "played_out", "missed", "heard_stop_ms")})
    # No call ended on the worker's side: all four were live at the end of the minute, none for a reason.
    assert health is not None and health["sessions"] == CALLS, (health, worker.report())
    assert {code: errors_counted(metrics, code) for code in ENDINGS} == dict.fromkeys(ENDINGS, 0.0)
    # Barge-in holds: the worker cut the reply at every interruption the callers had judged by then (each
    # caller's latest may be cut a moment after its report). How soon the caller heard the stop (printed
    # above) is a figure of a starved machine, where each end's audio waits for its loop: not asserted.
    confirmed = counted(metrics, "duplex_barge_ins_confirmed_total")
    print(f"barge-ins confirmed by the worker: {confirmed:g} of {judged} interruptions")
    assert judged >= 3 * CALLS and confirmed >= judged - CALLS, (confirmed, judged)
    for caller in summaries:
        assert caller is not None
        assert caller["error"] is None and caller["dropped"] is None, caller  # the call lasted the minute
        assert caller["no_reply"] == 0, caller  # every turn got its reply
        assert caller["attempts"] >= 3, caller
