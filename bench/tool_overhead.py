"""Tool overhead as the caller hears it, in-process and through the remote path, beside the same turn without a tool.

A direct aiortc caller (this process) asks "What's the weather in Paris?" and measures, on its own
side, from the frame holding the question's last speech sample leaving it to the first loud frame
of the answer reaching it. The reference model (Whisper + an OpenAI-compatible chat endpoint +
Piper) answers; the endpoint is a stub in this process that answers at once, so what a real LLM's
second round would cost is left out and what remains is ours.

Each turn is one of two kinds, in rounds of every path and kind whose order turns by one each round:

- tool: the endpoint calls ``get_weather`` (``bench.tool_overhead_tools``: sleeps a fixed time,
  then returns "Sunny in Paris."); the worker runs it at the edge, sends the
  output and ``response.create``; the endpoint's second round says the output;
- floor: the endpoint says the same sentence at once, with no call.

Overhead = the tool turn's wait, less the tool's own run time (the running worker's
``duplex_tool_run_seconds``), less the floor turn's wait. Two paths, each its own call:

- in-process: ``duplex-agent serve --responder openai --tools ...`` with the model in the worker;
- remote: a front worker (``serve --backend ws://.../v1/realtime?duplex=1 --tools ...``, no model)
  whose edge runs the tool, relaying to the in-process worker's realtime websocket, which runs the
  model. Both calls' models are the same process.

Beside the heard figures it prints where the tool turn's time went, from the endpoint's side:
question end -> first model round, first round -> second round (the call relayed, the tool run,
the output and response.create back), second round -> first sound, each beside the floor's.

Prints ours beside the floor; never passes or fails on time.

Run: python -m bench.tool_overhead [--quick] [--rounds N] [--tool-log DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from bench.call_rig import Service, free_port
from bench.caller_turn_latency import Caller
from bench.report import Report
from bench.stats import percentile
from bench.tool_overhead_tools import RUN_S
from devtools.speech import speak
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.support.chat_stub import chunk, start_server, stream_reply, tool_call_chunks

RATE = 48000
GOAL_MS = 150.0  # tool turn less the tool's run, beyond the floor turn
QUESTION = "What's the weather in Paris?"
ANSWER = "Sunny in Paris."
PATHS = ("in-process", "remote")
KINDS = ("tool", "floor")
TOOLS = "bench.tool_overhead_tools"


# ---- the chat endpoint ----


@dataclass
class Endpoint:
    """The stub LLM: calls the tool or answers directly, as the bench says for the next turn; notes
    when each request came."""

    with_tool: bool = True
    requests: list[tuple[float, str]] = field(default_factory=list)  # (when, "call" | "answer" | "floor")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        at = time.perf_counter()
        body = await request.json()
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        if last.get("role") == "tool":
            kind, chunks = "answer", [chunk(w) for w in _words(str(last.get("content") or ""))]
        elif self.with_tool and "get_weather" in tools:
            call_id = f"call_bench{len(self.requests)}"
            kind = "call"
            chunks = tool_call_chunks(0, call_id, "get_weather", json.dumps({"city": "Paris"}))
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        else:
            kind, chunks = "floor", [chunk(w) for w in _words(ANSWER)]
        self.requests.append((at, kind))
        return await stream_reply(request, chunks)


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


# ---- one turn ----


@dataclass
class Turn:
    path: str
    kind: str
    waited_ms: float | None = None  # question's last speech sent -> the answer's first loud frame heard
    tool_run_ms: float | None = None  # the worker's own measure of the tool's run
    first_round_ms: float | None = None  # question end -> the endpoint's first request
    between_rounds_ms: float | None = None  # first request -> second (tool turns)
    to_sound_ms: float | None = None  # the last request -> the first loud frame heard
    transcript: str = ""
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (ms after the question's end, what)


def tool_run_s(port: int) -> float:
    """The sum of ``duplex_tool_run_seconds`` on the worker at ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "duplex_tool_run_seconds_sum":
                return sample.value
    return 0.0


async def ask(caller: Caller, endpoint: Endpoint, path: str, kind: str, tool_port: int, question: np.ndarray) -> Turn:
    turn = Turn(path, kind)
    endpoint.with_tool = kind == "tool"
    run_before = await asyncio.to_thread(tool_run_s, tool_port)
    requests_before, events_before, heard_before = len(endpoint.requests), len(caller.events), len(caller.loud_at)
    await caller.until(lambda: caller.quiet_run > 25, 30)  # the agent quiet: a question, not a barge-in
    caller.mic.say(question)
    if not await caller.until(lambda: caller.mic.last_speech_sent_at is not None, 30):
        return turn
    spoke_at = caller.mic.last_speech_sent_at or time.perf_counter()
    heard = lambda: [t for t in caller.loud_at[heard_before:] if t > spoke_at]  # noqa: E731
    if not await caller.until(lambda: bool(heard()), 60):
        turn.timeline = [(1000.0 * (at - spoke_at), str(e.get("type"))) for at, e in caller.events[events_before:]
                         if e.get("type") != "metrics"]
        return turn
    heard_at = heard()[0]
    turn.waited_ms = 1000.0 * (heard_at - spoke_at)
    # The answer plays out and the agent listens again before the next question.
    await caller.until(lambda: any(at > heard_at and e.get("type") == "agent.state" and e.get("state") == "listening"
                                   for at, e in caller.events[events_before:]) and caller.quiet_run > 25, 60)
    turn.timeline = sorted([(1000.0 * (at - spoke_at), str(e.get("type")) + (f" {e['state']}" if "state" in e else ""))
                            for at, e in caller.events[events_before:] if e.get("type") != "metrics"]
                           + [(1000.0 * (at - spoke_at), f"chat request: {what}")
                              for at, what in endpoint.requests[requests_before:]]
                           + [(turn.waited_ms, "first sound heard")])
    done = caller.events_since(events_before, "response.output_audio_transcript.done")
    turn.transcript = " | ".join(str(e.get("transcript", "")) for e in done)
    requests = endpoint.requests[requests_before:]
    if requests:
        turn.first_round_ms = 1000.0 * (requests[0][0] - spoke_at)
        turn.to_sound_ms = 1000.0 * (heard_at - requests[-1][0])
        if kind == "tool" and len(requests) > 1:
            turn.between_rounds_ms = 1000.0 * (requests[1][0] - requests[0][0])
    if kind == "tool":
        turn.tool_run_ms = 1000.0 * (await asyncio.to_thread(tool_run_s, tool_port) - run_before)
    await caller.until(lambda: False, 0.5)  # a gap between turns
    return turn


def valid(turn: Turn) -> bool:
    """A turn that went as its kind says: answered, with the sentence, through a tool run when a tool turn."""
    if turn.waited_ms is None or "sunny" not in turn.transcript.lower():
        return False
    return turn.kind == "floor" or bool(turn.tool_run_ms)


# ---- the run ----


def order(round_index: int) -> list[tuple[str, str]]:
    """Each round asks all four (path, kind) turns, the order turned by one each round: over four
    rounds every turn takes every place once, so neither a place nor a kind favours one of them."""
    turns = [("in-process", "tool"), ("in-process", "floor"), ("remote", "floor"), ("remote", "tool")]
    shift = round_index % len(turns)
    return turns[shift:] + turns[:shift]


async def run(args: argparse.Namespace) -> None:
    address = args.ice_address or interface_ipv4()
    rounds = args.rounds or (4 if args.quick else 12)
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="tool_overhead-"))
    logs.mkdir(parents=True, exist_ok=True)
    endpoint = Endpoint()
    chat, base_url = await start_server(endpoint.handle)
    model_port, front_port = free_port(), free_port()
    common = ["--host", "127.0.0.1", "--ice-address", address, "--tools", TOOLS,
              # No hold sound: its notes are loud enough to pass for the answer's first sound.
              "--hold-after", "600", "--tool-timeout", "60",
              "--drain-timeout", "2"]  # stopped at the end with live calls: no waiting for them
    model = Service("model-worker", [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--port",
                                     str(model_port), "--plugin", "reference", "--responder", "openai",
                                     "--openai-base-url", base_url, "--openai-model", "stub", *common],
                    logs / "model-worker.log")
    front = Service("front-worker", [sys.executable, "-m", "duplex_agent.agent.app.cli", "serve", "--port",
                                     str(front_port), "--backend", f"ws://127.0.0.1:{model_port}/v1/realtime?duplex=1",
                                     *common], logs / "front-worker.log")
    print(f"== tool overhead: {rounds} rounds of 4 turns (in-process and remote, a tool and none); "
          f"the tool runs {1000 * RUN_S:.0f} ms; logs in {logs} ==", flush=True)
    question = speak(QUESTION, RATE, before_ms=200, after_ms=0)
    out = Report("tool_overhead", quick=args.quick)
    callers: dict[str, Caller] = {}
    try:
        model.start()
        await wait_up(model, model_port, 240)
        front.start()
        await wait_up(front, front_port, 120)
        ports = {"in-process": model_port, "remote": front_port}
        redialled = 0
        # One untimed turn per path and kind first: the model's and the tool path's first use.
        turns: list[Turn] = []
        for index in range(-1, rounds):
            for path, kind in order(index):
                if path in callers and not await flowing(callers[path]):
                    # A call the loaded machine dropped (its ICE consent lapsed, say): call again.
                    print(f"   the {path} call dropped: calling again", flush=True)
                    await callers.pop(path).close()
                    redialled += 1
                if path not in callers:
                    callers[path] = await dial(address, ports[path])
                turn = await ask(callers[path], endpoint, path, kind, ports[path], question)
                if index >= 0:
                    turns.append(turn)
                print(f"   round {index + 1:>2} {path:<10} {kind:<5} waited "
                      f"{_ms(turn.waited_ms)}  tool ran {_ms(turn.tool_run_ms)}  first round {_ms(turn.first_round_ms)}"
                      f"  between rounds {_ms(turn.between_rounds_ms)}  last round -> sound {_ms(turn.to_sound_ms)}"
                      f"{'' if valid(turn) else '  (not counted: ' + (turn.transcript or 'no answer') + ')'}",
                      flush=True)
                if args.timeline:
                    for at, what in turn.timeline:
                        print(f"        {at:7.0f} ms  {what}")
        report(turns, out)
        if redialled:
            print(f"  calls dropped and made again: {redialled}")
        out.write()
    finally:
        for caller in callers.values():
            await caller.close()
        front.stop()
        model.stop()
        await chat.cleanup()


async def dial(address: str, port: int) -> Caller:
    caller = Caller(address)
    async with aiohttp.ClientSession() as http:
        await caller.connect(http, f"http://127.0.0.1:{port}")
    if not await caller.until(lambda: caller.frames_heard > 10, 30):
        raise RuntimeError(f"no audio from the worker on port {port}")
    return caller


async def flowing(caller: Caller) -> bool:
    """The call is up and the agent's audio still arrives."""
    if caller.pc.connectionState != "connected":
        return False
    heard = caller.frames_heard
    return await caller.until(lambda: caller.frames_heard > heard + 2, 2)


async def wait_up(service: Service, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if not service.alive():
                raise RuntimeError(f"{service.name} exited:\n{service.tail()}")
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{service.name} did not come up in {timeout:.0f} s:\n{service.tail()}")


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.0f}"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(turns: list[Turn], out: Report) -> None:
    print(f"\ndirect WebRTC caller (aiortc); reference model, stub chat endpoint; tool run {1000 * RUN_S:.0f} ms")
    for path in PATHS:
        tool = [t for t in turns if t.path == path and t.kind == "tool" and valid(t)]
        floor = [t for t in turns if t.path == path and t.kind == "floor" and valid(t)]
        skipped = sum(1 for t in turns if t.path == path and not valid(t))
        less_run = [t.waited_ms - t.tool_run_ms for t in tool if t.waited_ms is not None and t.tool_run_ms]
        floor_ms = [t.waited_ms for t in floor if t.waited_ms is not None]
        # The edge's own part: the call relayed to the tool, its output and response.create back to
        # the model's second round, less the tool's run. The endpoint answers at once, so no LLM is in it.
        hop = [t.between_rounds_ms - t.tool_run_ms for t in tool if t.between_rounds_ms is not None and t.tool_run_ms]
        # The same from the model's first round on: the question's own work (the ASR, the same in
        # both kinds) left out, and with it most of what a loaded machine adds by chance.
        after_tool = [t.waited_ms - t.first_round_ms - t.tool_run_ms for t in tool
                      if t.waited_ms is not None and t.first_round_ms is not None and t.tool_run_ms]
        after_floor = [t.waited_ms - t.first_round_ms for t in floor
                       if t.waited_ms is not None and t.first_round_ms is not None]
        after_first = _median(after_tool) - _median(after_floor)
        print(f"  {path}:")
        print(f"    tool turn less the tool's run: {_spread(less_run)}")
        print(f"    floor, the same turn, no tool: {_spread(floor_ms)}")
        print(f"    overhead: p50 {_median(less_run) - _median(floor_ms):6.0f} ms   (goal <= {GOAL_MS:.0f} ms)"
              + (f"   turns not counted: {skipped}" if skipped else ""))
        print(f"    from the model's first round on (the ASR left out): p50 {after_first:6.0f} ms")
        print(f"    where it went, p50: question end -> first model round {_p50(tool, 'first_round_ms')} ms "
              f"(floor {_p50(floor, 'first_round_ms')}); first round -> second, less the tool's run "
              f"{_median(hop):5.0f} ms; last round -> first sound {_p50(tool, 'to_sound_ms')} ms "
              f"(floor {_p50(floor, 'to_sound_ms')})")
        short = "in_process" if path == "in-process" else "remote"
        where = "the model in the worker" if path == "in-process" else \
            "a front worker's edge runs the tool, the model behind our realtime websocket"
        out.add(f"tools.overhead_{short}_p50", f"tool turn as the caller hears it, less the tool's run time, p50 "
                f"(end of question -> first sound of the answer), {where}; floor: the same turn answered without "
                f"a tool", _median(less_run) if less_run else None, floor=_median(floor_ms) if floor_ms else None,
                unit="ms", n=min(len(less_run), len(floor_ms)), area="tools",
                note=f"from the model's first round on: {after_first:+.0f} ms" if after_tool and after_floor else "")
        out.add(f"tools.call_hop_{short}_p50", f"the tool call's hop, p50: the model's call -> its second round "
                f"(the call relayed, the output and response.create back), less the tool's run time, {where}",
                _median(hop) if hop else None, unit="ms", n=len(hop), area="tools")


def _spread(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50 {statistics.median(values):6.0f} ms  p95 {percentile(values, 95):6.0f} ms  (n={len(values)})"


def _p50(turns: list[Turn], name: str) -> str:
    values = [getattr(t, name) for t in turns if getattr(t, name) is not None]
    return f"{_median(values):5.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds instead of 12")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of four turns (overrides --quick)")
    parser.add_argument("--ice-address", default="", help="local address for ICE (default: this machine's interface)")
    parser.add_argument("--timeline", action="store_true", help="print each turn's events, by time after the question")
    parser.add_argument("--log-dir", default="", help="where the workers' logs go (default: a new temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
