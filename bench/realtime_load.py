"""N realtime websocket sessions at once against a running server, each streaming caller audio in real time.

For each N in ``--sessions``, N sessions open ``/v1/realtime?duplex=1`` (staggered across one
frame), then each sends 80 ms of pcm16 every 80 ms on an absolute schedule for ``--seconds``. A
sender that wakes more than a frame late drops the frames it missed instead of sending them in
a burst (a microphone does not queue), and counts them. Each session also times the agent audio
it receives: within one response, delta k's arrival against the earliest-arriving delta's schedule
(its ``audio_start_ms`` says where it belongs), so a delta later than one frame is one a caller with
a frame of buffer would hear as a gap. Beside those, from the server's ``/metrics`` over the round:
model steps that finished after their frame was due (``duplex_frame_overruns``), and error events.

Prints one line per round as it ends (``--json PATH`` also appends each round as a JSON line);
never fails on time. Against ``duplex-agent serve --plugin moshi`` started with
``--max-sessions`` at least the largest N and ``--sessions-per-minute 0``:

    python -m bench.realtime_load --url http://127.0.0.1:8080 --sessions 1,8,32,64 --seconds 15

Imports only aiohttp, numpy and prometheus_client (it runs on the GPU host of bench/gpu_check.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.stats import percentile

RATE = 24000
FRAME_MS = 80.0
FRAME = int(RATE * FRAME_MS / 1000)


@dataclass(slots=True)
class SessionFigures:
    sent: int = 0
    #: Frames the sender skipped because it woke more than a frame after they were due.
    dropped_sends: int = 0
    #: How late each frame left against its schedule (ms).
    send_late_ms: list[float] = field(default_factory=list)
    #: Per received audio delta: how late it arrived against its response's schedule (ms).
    receive_late_ms: list[float] = field(default_factory=list)
    lagging: int = 0
    errors: list[str] = field(default_factory=list)
    failed: str = ""


def caller_audio(seconds: float, seed: int) -> np.ndarray:
    """A gliding tone with noise, different per session, as pcm16 frames' worth of samples."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE) + FRAME) / RATE
    pitch = 120 + 15 * (seed % 16) + 40 * np.sin(2 * np.pi * 0.7 * t)
    audio = 0.4 * np.sin(2 * np.pi * np.cumsum(pitch) / RATE) + 0.02 * rng.standard_normal(t.size)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2")


async def open_session(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    """A realtime session, created (the server took it: a batch slot is the first append's)."""
    ws = await http.ws_connect(url, max_msg_size=16 << 20)
    try:
        await ws.send_str(json.dumps({"type": "session.update", "session": {
            "turn_detection": None, "input_sample_rate": RATE}}))
        while True:
            event = json.loads(await ws.receive_str(timeout=120))
            if event["type"] == "session.created":
                return ws
            if event["type"] == "error":
                raise ConnectionError(f"refused: {event.get('error', event)}")
    except BaseException:
        await ws.close()
        raise


async def stream_session(ws: aiohttp.ClientWebSocketResponse, index: int, start: float, seconds: float,
                         figures: SessionFigures) -> None:
    loop = asyncio.get_running_loop()
    audio = caller_audio(seconds, index)
    receiver = asyncio.create_task(receive(ws, figures))
    try:
        frames = int(seconds * 1000 / FRAME_MS)
        index_due = 0
        while index_due < frames:
            due = start + index_due * FRAME_MS / 1000
            now = loop.time()
            if now < due:
                await asyncio.sleep(due - now)
                now = loop.time()
            missed = int((now - due) * 1000 // FRAME_MS)
            if missed:
                figures.dropped_sends += missed
                index_due += missed
                continue
            chunk = audio[index_due * FRAME:(index_due + 1) * FRAME].tobytes()
            figures.send_late_ms.append(1000 * (now - due))
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(chunk).decode()}))
            figures.sent += 1
            index_due += 1
        # Ended, not dropped (a dropped socket's session is kept for a resume, holding its slot).
        await ws.send_str(json.dumps({"type": "session.close"}))
        await asyncio.wait_for(asyncio.shield(receiver), timeout=10)
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await ws.close()


async def receive(ws: aiohttp.ClientWebSocketResponse, figures: SessionFigures) -> None:
    """Times agent audio deltas; the schedule of a response is its earliest (arrival - position)."""
    loop = asyncio.get_running_loop()
    anchors: dict[str, float] = {}
    offsets: dict[str, list[float]] = {}
    try:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            now = loop.time()
            event = json.loads(message.data)
            kind = event.get("type")
            if kind == "response.output_audio.delta":
                response = event.get("response_id", "")
                offset = 1000 * now - float(event.get("audio_start_ms", 0.0))
                offsets.setdefault(response, []).append(offset)
                anchors[response] = min(anchors.get(response, offset), offset)
            elif kind == "session.closed":
                break
            elif kind == "session.lagging":
                figures.lagging += 1
            elif kind == "error":
                figures.errors.append(str(event.get("error", {}).get("code", "?")))
    finally:
        for response, values in offsets.items():
            figures.receive_late_ms.extend(v - anchors[response] for v in values)


def scrape(text: str) -> dict[str, float]:
    """The counters a round compares: frame overruns and error events (all codes)."""
    found = {"overruns": 0.0, "errors": 0.0, "sessions": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "duplex_frame_overruns_total":
                found["overruns"] += sample.value
            elif sample.name == "duplex_errors_total":
                found["errors"] += sample.value
            elif sample.name == "duplex_sessions_active" and sample.labels.get("transport") == "all":
                found["sessions"] = sample.value
    return found


async def metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with http.get(base + "/metrics") as response:
        return scrape(await response.text())


async def one_round(http: aiohttp.ClientSession, base: str, sessions: int, seconds: float) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    # The previous round's sessions must have left (their batch slots are freed when they close).
    for _ in range(100):
        if (await metrics(http, base))["sessions"] == 0:
            break
        await asyncio.sleep(0.1)
    before = await metrics(http, base)
    url = base.replace("http", "ws", 1) + "/v1/realtime?duplex=1"
    began = time.perf_counter()
    opened = await asyncio.gather(*(open_session(http, url) for _ in range(sessions)), return_exceptions=True)
    all_figures = [SessionFigures() for _ in range(sessions)]
    streams = []
    start = loop.time() + 0.2  # every session starts together, staggered across one frame
    for i, (figures, ws) in enumerate(zip(all_figures, opened, strict=True)):
        if isinstance(ws, BaseException):
            figures.failed = f"{type(ws).__name__}: {ws}"
        else:
            streams.append(stream_session(ws, i, start + (i / sessions) * FRAME_MS / 1000, seconds, figures))
    for figures, result in zip([f for f in all_figures if not f.failed], await asyncio.gather(
            *streams, return_exceptions=True), strict=True):
        if isinstance(result, BaseException):
            figures.failed = f"{type(result).__name__}: {result}"
    after = await metrics(http, base)
    late = [v for f in all_figures for v in f.receive_late_ms]
    send_late = [v for f in all_figures for v in f.send_late_ms]
    return {
        "sessions": sessions, "seconds": seconds, "wall_s": round(time.perf_counter() - began, 1),
        "failed": [f.failed for f in all_figures if f.failed][:3],
        "frames_sent": sum(f.sent for f in all_figures),
        "sends_dropped": sum(f.dropped_sends for f in all_figures),
        "send_late_p99_ms": round(percentile(send_late, 99), 1),
        "audio_frames_received": len(late),
        "receive_late_p50_ms": round(percentile(late, 50), 1),
        "receive_late_p99_ms": round(percentile(late, 99), 1),
        "receive_late_over_frame": sum(v > FRAME_MS for v in late),
        "session_lagging_events": sum(f.lagging for f in all_figures),
        "server_frame_overruns": after["overruns"] - before["overruns"],
        "server_error_events": after["errors"] - before["errors"],
    }


def describe(r: dict[str, object]) -> str:
    failed = f"  FAILED sessions: {r['failed']}" if r["failed"] else ""
    return (f"N={r['sessions']:3d}: sent {r['frames_sent']} frames (dropped late {r['sends_dropped']}, "
            f"send lateness p99 {r['send_late_p99_ms']} ms); received {r['audio_frames_received']} agent audio "
            f"frames, lateness p50 {r['receive_late_p50_ms']} ms p99 {r['receive_late_p99_ms']} ms, "
            f"{r['receive_late_over_frame']} over one frame; session.lagging {r['session_lagging_events']}; "
            f"server: frame overruns +{r['server_frame_overruns']:.0f}, error events +{r['server_error_events']:.0f} "
            f"[{r['wall_s']} s]{failed}")


async def run(args: argparse.Namespace) -> None:
    base = args.url.rstrip("/")
    deadline = time.monotonic() + args.budget_s if args.budget_s else float("inf")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for sessions in args.sessions:
            if time.monotonic() + args.seconds + 5 > deadline:
                print(f"N={sessions:3d}: skipped (the time budget of {args.budget_s:.0f} s is spent)", flush=True)
                continue
            result = await one_round(http, base, sessions, args.seconds)
            print(describe(result), flush=True)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps(result) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realtime_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server (loopback)")
    parser.add_argument("--sessions", type=lambda s: [int(n) for n in s.split(",")], default=[1, 8, 32, 64],
                        help="comma-separated session counts, one round each")
    parser.add_argument("--seconds", type=float, default=15.0, help="audio each session streams per round")
    parser.add_argument("--budget-s", type=float, default=0.0, help="skip rounds that would end past this (0: none)")
    parser.add_argument("--json", default="", help="append each round's figures to this file as a JSON line")
    args = parser.parse_args(argv)
    print(f"realtime load: {args.url}, rounds of {args.sessions} sessions, {args.seconds:g} s of audio each, "
          f"{FRAME_MS:.0f} ms frames paced in real time", flush=True)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
