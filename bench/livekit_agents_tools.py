"""A tool's overhead in a LiveKit Agents app, as the caller hears it.

Same run, same room setup, same caller and question, the same scripted voice in the worker's own
process. Per round: ``tool``, where the model answers through the Agent's get_weather
``@function_tool`` (it calls, AgentSession runs the tool, the output goes back, the model is asked
for its answer), and ``plain``, where the same voice says the same answer outright. Figure: from
the end of the caller's question to the first sound of the answer, less the tool's own run time
(measured in the tool), beyond the same turn without a tool (the floor): what running a tool adds.

Prints figures; never passes or fails on time.

Run: python -m bench.livekit_agents_tools [--rounds 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.livekit_agents_bargein import LOUD, Caller, _records, _rms, _until
from bench.report import Report
from bench.stats import percentile, summary
from devtools.livekit_server import LoopbackLiveKitServer
from devtools.speech import speak

REPO = Path(__file__).resolve().parents[1]
AGENT_NAME = "duplex-tools-bench"  # bench/livekit_agents_tools_app.py's
QUESTION = "What is the weather in Paris?"


def _loud_span_s(audio: np.ndarray) -> float:
    """From the clip's first loud sample to its last, in seconds (48 kHz)."""
    loud = np.flatnonzero(np.abs(audio) > LOUD)
    return float(loud[-1] - loud[0]) / 48000


async def one_round(server: LoopbackLiveKitServer, record: Path, mode: str, room: str, question: np.ndarray) -> dict:
    caller = Caller(server.url, server.mint_token(f"caller-{room}", room))
    await caller.join()
    try:
        await server.create_dispatch(room, AGENT_NAME, metadata=mode)
        await _until(lambda: any(r["kind"] == "started" for r in _records(record, room)), 60, "the job")
        caller.say(question, mark_onset=True)
        await _until(lambda: caller.onset_at is not None, 30, "the question's first sound")
        ended = caller.onset_at + _loud_span_s(question)  # its audio goes out at real time
        await _until(lambda: any(t > ended and _rms(s) > LOUD for t, s in caller.received), 60, "the answer")
        first = next(t for t, s in caller.received if t > ended and _rms(s) > LOUD)
        result = {"answer_ms": 1000.0 * (first - ended)}
        if mode == "tool":
            runs = [r["run_ms"] for r in _records(record, room) if r["kind"] == "tool"]
            if len(runs) != 1:
                raise TimeoutError(f"the tool ran {len(runs)} times")
            result["tool_ms"] = runs[0]
        return result
    finally:
        await caller.leave()


async def main(rounds: int, report: Report) -> None:
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-tools-bench")
    await server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    logs = Path(tempfile.mkdtemp(prefix="lk-tools-"))
    record = logs / "record.jsonl"
    worker = None
    try:
        worker = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "livekit_agents_tools_app.py"), "start"], cwd=REPO,
            env={**env, "LIVEKIT_URL": server.url, "LIVEKIT_API_KEY": server.api_key,
                 "LIVEKIT_API_SECRET": server.api_secret, "PYTHONPATH": str(REPO), "BENCH_RECORD": str(record)},
            stdout=(logs / "worker.log").open("w"), stderr=subprocess.STDOUT)
        await server.wait_for_worker(AGENT_NAME, available=True, timeout=120)
        question = speak(QUESTION, 48000, before_ms=300, after_ms=1500)
        results: dict[str, list[dict]] = {"plain": [], "tool": []}
        for n in range(rounds):
            for mode in results:
                try:
                    results[mode].append(await one_round(server, record, mode, f"{mode}-{n}", question))
                except TimeoutError as exc:
                    print(f"  round {n} {mode}: {exc} (left out)", flush=True)
                else:
                    print(f"  round {n} {mode}: {results[mode][-1]}", flush=True)
        plain = [r["answer_ms"] for r in results["plain"]]
        tool = [r["answer_ms"] for r in results["tool"]]
        less_tool = [r["answer_ms"] - r["tool_ms"] for r in results["tool"]]
        print(f"question's end to the answer's first sound, no tool (the floor): {summary(plain, 'ms')}")
        print(f"the same through get_weather: {summary(tool, 'ms')}; less the tool's run time "
              f"{summary(less_tool, 'ms')}")
        if less_tool and plain:
            print(f"  a tool's overhead: p50 {percentile(less_tool, 50) - percentile(plain, 50):+.0f} ms, "
                  f"p95 {percentile(less_tool, 95) - percentile(plain, 95):+.0f} ms")
        report.add("livekit_agents.tool_overhead_p50",
                   "LiveKit Agents app, our DuplexModel: the end of the caller's question to the answer's first "
                   "sound through an Agent's @function_tool, less the tool's run time, p50; floor: the same turn "
                   "answered without a tool", percentile(less_tool, 50), floor=percentile(plain, 50), unit="ms",
                   n=len(less_tool), area="tools")
        report.write()
        print(f"(logs in {logs})")
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    asyncio.run(main(3 if args.quick else args.rounds, Report("livekit_agents_tools", quick=args.quick)))
