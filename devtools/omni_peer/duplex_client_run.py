"""vLLM-Omni's own ``DuplexClient`` against duplex servers; prints one JSON report line per run.

Run with ``.venv-omni/bin/python -m devtools.omni_peer.duplex_client_run --run URL DROP
[--run URL DROP ...] [--turns 2]``: the runs go side by side in this one process, a session
each (importing vLLM-Omni takes most of a run's time). Each turn streams a 600 ms tone, commits with a
response, drains the reply's audio and acknowledges its playback, as an application built on the
client would. A ``DROP`` of N > 0 aborts the TCP connection (no close frame) after turn N, so the
client's own resume runs; 0 never drops it. ``silentN`` drops it in the middle of turn N's reply,
at its first audio, the way a network that went away does: the client connects through a
``tests.silent_path.SilentPath``, which goes silent both ways and resets only the client's leg, so
the server's side of the old socket stays open with its sends backing up while the client
resumes on a new one. The tests read the reports; this script asserts nothing itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import numpy as np

TURN_TIMEOUT_S = 60.0


def tone_pcm16(ms: int, hz: float = 440.0, rate: int = 16000) -> bytes:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes()


async def run(url: str, *, turns: int, drop: str, model: str) -> dict:
    import websockets
    from vllm_omni.clients.duplex import DuplexClient, DuplexClientError, SessionConfig

    from tests.silent_path import SilentPath

    silent_turn = int(drop.removeprefix("silent")) if drop.startswith("silent") else None
    drop_after = None if silent_turn is not None else int(drop) or None
    sockets = []
    path = await SilentPath(urlsplit(url).port or 80).start() if silent_turn is not None else None

    async def connect(target: str):
        if path is not None:  # the same server, through the path that can go silent
            parts = urlsplit(target)
            target = urlunsplit(parts._replace(netloc=f"127.0.0.1:{path.port}"))
        ws = await websockets.connect(target, max_size=64 << 20)
        sockets.append(ws)
        return ws

    report: dict = {"turns": [], "errors": [], "resumed": 0, "session_ids": [], "events": [], "silenced": 0}
    config = SessionConfig(turn_detection=None, auto_response=False)
    try:
        async with DuplexClient(url, model=model, config=config, connect=connect,
                                heartbeat_interval_s=None) as client:
            report["session_ids"].append(client.session_id)
            watcher = asyncio.create_task(_watch(client, report))
            responses = client.responses()
            for turn in range(turns):
                await client.stream_pcm(tone_pcm16(600), realtime=False)
                await client.commit(create_response=True)
                handle = await asyncio.wait_for(anext(responses), TURN_TIMEOUT_S)
                audio = 0
                async for chunk in handle.audio():
                    audio += len(chunk)
                    if path is not None and silent_turn == turn + 1 and not report["silenced"]:
                        report["silenced"] = path.go_silent(reset_clients=True)
                    # An ack into a socket that just dropped is lost, as an application's would be.
                    with contextlib.suppress(websockets.ConnectionClosed, OSError, DuplexClientError):
                        await client.ack_playback(handle.played_ms, response_id=handle.response_id)
                await handle.wait(TURN_TIMEOUT_S)
                done = handle.done_event.raw if handle.done_event is not None else {}
                report["turns"].append({
                    "response_id": handle.response_id, "decision": handle.decision,
                    "transcript": handle.transcript, "text": handle.text, "audio_bytes": audio,
                    "played_ms": handle.played_ms, "done_type": done.get("type"),
                    "status": (done.get("response") or {}).get("status"),
                })
                if drop_after is not None and turn + 1 == drop_after:
                    sockets[-1].transport.abort()
                    deadline = time.monotonic() + TURN_TIMEOUT_S
                    while report["resumed"] == 0 and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
            report["session_ids"].append(client.session_id)
            watcher.cancel()
    except (TimeoutError, DuplexClientError, StopAsyncIteration, OSError) as exc:
        report["failure"] = f"{type(exc).__name__}: {exc}"
    finally:
        if path is not None:
            await path.close()
    return report


async def _watch(client, report: dict) -> None:
    async for event in client.events():
        if not event.type.endswith(".delta"):
            report["events"].append(event.type)
        if event.type == "error":
            report["errors"].append({"code": event.code, "message": event.message})
        elif event.type == "connection.resumed":
            report["resumed"] += 1


def main() -> int:
    from devtools.omni_peer import native_stubs

    native_stubs.install()
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", nargs=2, action="append", required=True, metavar=("URL", "DROP"))
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--model", default="duplex")
    args = parser.parse_args()
    asyncio.run(_run_all(args.run, turns=args.turns, model=args.model))
    return 0


async def _run_all(runs: list[tuple[str, str]], *, turns: int, model: str) -> None:
    """Every run side by side, each a session of its own; the reports in the order asked."""
    reports = await asyncio.gather(*(run(url, turns=turns, drop=drop, model=model) for url, drop in runs))
    for (url, drop), report in zip(runs, reports):
        print(json.dumps({"url": url, "drop": drop, **report}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
