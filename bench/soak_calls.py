"""The soak's calls: one caller process per call (``bench.livekit_callers``, one session), placed
on ``lines`` that each start a new call as soon as theirs ends, so the load holds at ``lines``
calls at once however long each one runs. A fresh process per call shares nothing with the last
one on the caller's side: whatever grows, grows in the worker.

A call's outcome is read from its caller's figures: dropped (the caller process failed, its
connection errored, or it never heard the agent) or its questions answered and unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.call_rig import REPO, child_env


@dataclass(frozen=True)
class Target:
    """Where a kind of call goes: a direct worker's URL, or a LiveKit server and the agent to dispatch."""

    kind: str  # "direct", "livekit", "agents"
    transport: str  # livekit_callers' --transport
    url: str
    agent_name: str = ""
    metadata: str = ""  # the dispatched job's metadata, for a LiveKit Agents app's mode
    resumes: bool = False  # the path has a resume: every other call drops its connection once and resumes


@dataclass
class CallResult:
    index: int
    kind: str
    started_s: float  # since the soak began
    planned_s: float
    ended_s: float = 0.0
    dropped: str = ""  # why the call was lost; empty when it was not
    room: str = ""  # the LiveKit room's prefix, to find the call in the logs
    questions: int = 0
    unanswered: int = 0
    interruptions: int = 0
    resumes: int = 0
    turn_ms: list[float] = field(default_factory=list)
    bargein_ms: list[float] = field(default_factory=list)


def caller_command(target: Target, seconds: float, speech: str, resume_after_s: float = 0.0,
                   room: str = "") -> list[str]:
    command = [sys.executable, "-m", "bench.livekit_callers", "--transport", target.transport, "--url", target.url,
               "--sessions", "1", "--seconds", f"{seconds:.1f}", "--speech", speech, "--ignore-stdin"]
    if resume_after_s:
        command += ["--resume-after", f"{resume_after_s:.1f}"]
    if target.transport == "livekit":
        command += ["--agent-name", target.agent_name, "--room-prefix", room]
        if target.metadata:
            command += ["--dispatch-metadata", target.metadata]
    return command


def judge(result: CallResult, returncode: int | None, stdout: str, stderr: str) -> CallResult:
    """Fill the call's outcome in from its caller process's exit and JSON lines."""
    lines = []
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    done = next((m for m in lines if m.get("event") == "done"), None)
    if returncode != 0 or done is None or not done.get("callers"):
        result.dropped = f"caller process failed (rc {returncode}): {stderr.strip()[-300:]}"
        return result
    caller = done["callers"][0]
    result.questions = len(caller.get("said", []))
    result.unanswered = int(caller.get("no_reply", 0))
    result.interruptions = int(caller.get("attempts", 0))
    result.resumes = int(caller.get("resumes", 0))
    result.turn_ms = [float(v) for v in caller.get("reply_after_ms", [])]
    result.bargein_ms = [float(v) for v in caller.get("heard_stop_ms", [])]
    if caller.get("error"):
        result.dropped = f"caller error: {caller['error']}"
    elif not caller.get("frames"):
        result.dropped = "never heard the agent"
    return result


async def place_call(index: int, target: Target, seconds: float, speech: str, t0: float,
                     resume_after_s: float = 0.0) -> CallResult:
    result = CallResult(index, target.kind, time.monotonic() - t0, seconds)
    if target.transport == "livekit":
        result.room = f"soak-{target.kind}-{index}-{uuid.uuid4().hex[:6]}"
    proc = await asyncio.create_subprocess_exec(
        *caller_command(target, seconds, speech, resume_after_s, result.room), cwd=REPO, env=child_env(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        # A caller runs for its seconds, then hangs up; the rest is its start and its hang-up on a loaded machine.
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 120)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    result.ended_s = time.monotonic() - t0
    return judge(result, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@dataclass
class Schedule:
    """How long the soak places calls and how long each one is."""

    run_s: float
    lines: int
    call_s: tuple[float, float]  # each call's length, drawn uniformly from this range
    seed: int = 0


async def run_lines(schedule: Schedule, targets: list[Target], speech: str, t0: float,
                    on_start: Callable[[str], None], on_end: Callable[[CallResult], None]) -> list[CallResult]:
    """Keep ``schedule.lines`` calls going until the run's end; the kinds take turns. Lines start
    staggered over one mean call length, so calls end spread out rather than all at once."""
    rng = random.Random(schedule.seed)
    results: list[CallResult] = []
    counter = iter(range(1_000_000))
    mean_s = sum(schedule.call_s) / 2

    async def line(number: int) -> None:
        await asyncio.sleep(number * mean_s / schedule.lines)
        while True:
            left = schedule.run_s - (time.monotonic() - t0)
            if left < schedule.call_s[0]:
                return
            index = next(counter)
            seconds = min(rng.uniform(*schedule.call_s), left)
            target = targets[index % len(targets)]
            # Now and then, not every call: a resume midway through every other call of a path that has one.
            resume_after = seconds / 2 if target.resumes and (index // len(targets)) % 2 == 0 else 0.0
            on_start(target.kind)
            result = await place_call(index, target, seconds, speech, t0, resume_after)
            results.append(result)
            on_end(result)

    await asyncio.gather(*(line(n) for n in range(schedule.lines)))
    return sorted(results, key=lambda r: r.index)
