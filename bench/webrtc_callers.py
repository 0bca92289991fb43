"""Several aiortc callers against a worker's ``POST /api/offer``, in a process of their own.

A standalone load generator (``bench.livekit_callers`` reuses its offer and stdin
helpers); in a process of its own, the callers' CPU (Opus, SRTP, ICE) is not
counted against the worker. Each caller connects, says one utterance (Piper
speech) after a short pause, then sends silence, and counts the agent audio it
receives. Runs for ``--seconds`` or until its stdin closes, whichever comes
first, then closes every peer and prints one JSON line with per-caller figures.

Run: python -m bench.webrtc_callers --url http://127.0.0.1:PORT --peers N --seconds S
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time

import aiohttp
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from duplex_agent.webrtc.direct.host_address import candidates_on, interface_ipv4
from duplex_agent.webrtc.direct.ice_consent import keep_consent
from duplex_agent.webrtc.direct.tracks import PlayoutTrack, frame_to_mono_f32

DEFAULT_UTTERANCE = "Please tell me a long story about the sea and the ships."
LOUD_RMS = 0.02


class ConnectFailed(RuntimeError):
    """``retry_after_s``: the worker refused the call as busy and said when to ask again."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


async def offer_and_connect(pc: RTCPeerConnection, address: str, http: aiohttp.ClientSession, url: str) -> float:
    """Offer through the worker's ``/api/offer`` and wait until connected; seconds it took."""
    return (await offer_and_answer(pc, address, http, url))[0]


async def offer_and_answer(pc: RTCPeerConnection, address: str, http: aiohttp.ClientSession, url: str,
                           extra: dict[str, object] | None = None) -> tuple[float, dict]:
    """Offer (with ``extra`` fields: ``resumable``, ``resume``) and wait until connected: the seconds
    it took and the worker's answer (its ``pc_id``, and ``resume_token`` for a resumable peer)."""
    started = time.perf_counter()
    with candidates_on(address):
        await pc.setLocalDescription(await pc.createOffer())
    offer = {"sdp": pc.localDescription.sdp, "type": "offer", **(extra or {})}
    async with http.post(url + "/api/offer", json=offer) as response:
        if response.status != 200:
            retry_after = response.headers.get("Retry-After", "") if response.status == 503 else ""
            raise ConnectFailed(f"offer answered {response.status}: {(await response.text())[:200]}",
                                float(retry_after) if retry_after.isdigit() else None)
        answer = await response.json()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
    keep_consent(pc)  # as a browser keeps it (RFC 7675's 30 s), not aioice's few seconds
    while pc.connectionState not in ("connected", "failed", "closed"):
        await asyncio.sleep(0.02)
        if time.perf_counter() - started > 20:
            raise ConnectFailed("not connected after 20 s")
    if pc.connectionState != "connected":
        raise ConnectFailed(f"connection {pc.connectionState}")
    return time.perf_counter() - started, answer


class OneUtterance:
    """A next_frame source: ``lead_ms`` of silence, the utterance once, then silence."""

    def __init__(self, speech48k: np.ndarray, lead_ms: float) -> None:
        lead = np.zeros(int(48 * lead_ms), np.float32)
        audio = np.concatenate([lead, speech48k.astype(np.float32)])
        self._pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
        self._position = 0

    def next_frame(self) -> np.ndarray:
        frame = np.zeros(960, np.int16)
        chunk = self._pcm[self._position : self._position + 960]
        frame[: chunk.size] = chunk
        self._position += 960
        return frame


class Caller:
    def __init__(self, index: int, address: str, speech48k: np.ndarray, lead_ms: float) -> None:
        self.index = index
        self.address = address
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("events")
        self.pc.addTrack(PlayoutTrack(OneUtterance(speech48k, lead_ms).next_frame))
        self.pc.on("track", self._on_track)
        self.channel.on("message", self._on_message)
        self.error: str | None = None
        self.connected_s: float | None = None
        self.first_frame_at: float | None = None
        self.last_frame_at: float | None = None
        self.frames = 0
        self.loud_frames = 0
        self.first_loud_at: float | None = None
        self.max_gap_ms = 0.0
        self.responses_done = 0
        self._readers: list[asyncio.Task[None]] = []

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            return
        if isinstance(event, dict) and event.get("type") == "response.done":
            self.responses_done += 1

    def _on_track(self, track) -> None:
        async def read() -> None:
            try:
                while True:
                    frame = await track.recv()
                    now = time.perf_counter()
                    samples = frame_to_mono_f32(frame)
                    if self.last_frame_at is not None:
                        self.max_gap_ms = max(self.max_gap_ms, 1000.0 * (now - self.last_frame_at))
                    if self.first_frame_at is None:
                        self.first_frame_at = now
                    self.last_frame_at = now
                    self.frames += 1
                    if float(np.sqrt(np.mean(samples**2))) > LOUD_RMS:
                        self.loud_frames += 1
                        if self.first_loud_at is None:
                            self.first_loud_at = now
            except MediaStreamError:
                pass

        self._readers.append(asyncio.create_task(read()))

    async def connect(self, http: aiohttp.ClientSession, url: str) -> None:
        try:
            self.connected_s = await offer_and_connect(self.pc, self.address, http, url)
        except Exception as exc:  # report, do not crash the other callers
            self.error = str(exc) if isinstance(exc, ConnectFailed) else repr(exc)

    async def close(self) -> None:
        await self.pc.close()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)

    def figures(self) -> dict[str, object]:
        span = (self.last_frame_at - self.first_frame_at) if self.first_frame_at and self.last_frame_at else 0.0
        return {
            "index": self.index,
            "error": self.error,
            "connected_s": None if self.connected_s is None else round(self.connected_s, 3),
            "frames": self.frames,
            "frames_per_s": round(self.frames / span, 2) if span > 1 else None,
            "loud_frames": self.loud_frames,
            "first_loud_after_s": (round(self.first_loud_at - self.first_frame_at, 3)
                                   if self.first_loud_at and self.first_frame_at else None),
            "max_gap_ms": round(self.max_gap_ms, 1),
            "responses_done": self.responses_done,
        }


def _load_speech(path: str | None, text: str) -> np.ndarray:
    if path:
        return np.load(path).astype(np.float32)
    from devtools.speech import speak

    return speak(text, 48000)


def stop_on_stdin_close(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def run(args: argparse.Namespace) -> dict[str, object]:
    speech = _load_speech(args.speech, args.text)
    address = args.ice_address or interface_ipv4()
    url = args.url.rstrip("/")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if not args.ignore_stdin:
        stop_on_stdin_close(loop, stop)
    callers = [Caller(i, address, speech, args.lead_ms) for i in range(args.peers)]
    started = time.perf_counter()
    cpu_started = time.process_time()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(c.connect(http, url) for c in callers))
    print(json.dumps({"event": "connected", "peers": sum(c.connected_s is not None for c in callers),
                      "elapsed_s": round(time.perf_counter() - started, 3)}), flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, args.seconds - (time.perf_counter() - started)))
    cpu = time.process_time() - cpu_started
    wall = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    return {"event": "done", "peers": [c.figures() for c in callers], "wall_s": round(wall, 2),
            "callers_cpu_cores": round(cpu / wall, 3) if wall > 0 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the worker's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--peers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0, help="most seconds to stay connected")
    parser.add_argument("--ice-address", default="", help="local address for ICE (default: this machine's interface)")
    parser.add_argument("--speech", default="", help=".npy file of float32 48 kHz speech (default: Piper says --text)")
    parser.add_argument("--text", default=DEFAULT_UTTERANCE)
    parser.add_argument("--lead-ms", type=float, default=400.0, help="silence before the utterance")
    parser.add_argument("--ignore-stdin", action="store_true", help="run for --seconds even if stdin closes")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
