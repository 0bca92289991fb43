"""The transport floor: bare aiortc peers that send each caller's audio straight back, or answer it with a tone.

Speaks the worker's ``POST /api/offer`` (so the same callers connect to it) and
serves ``/metrics`` with the one figure the benches read from it, the open peers.
No model, no resampling, no VAD: what a call costs aiortc as shipped (its decoder
thread, its Opus encoder, SRTP, ICE). Run as its own process by ``bench.call_rig``.

``--reply tone``: the floor of barge-in and turn latency as the caller hears them
(``bench.direct_heard``). Each caller's audio arrives through the worker's own receive path
(``AdaptiveCallerAudioReader``, the default ``receive_buffer``: aiortc's jitter buffer holds each
packet until 4 newer ones came, ~80 ms the worker does not have); once the caller has been quiet for ``--end-silence-ms`` after speaking (the worker's own
end-of-turn silence), the peer answers with a 1 s tone, and the first 20 ms frame of the
caller's that holds sound (a 5 ms block over -40 dBFS) while the tone plays stops it: the
next frame sent is silence. It sends through the worker's own track (``PlayoutTrack``), so
what differs from the worker, both ways, is the reaction alone.

Run: python -m bench.echo_peer --port 8090 [--ice-address A.B.C.D] [--reply tone]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import numpy as np
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from duplex_agent.webrtc.direct.caller_receive import AdaptiveCallerAudioReader
from duplex_agent.webrtc.direct.host_address import candidates_on, interface_ipv4
from duplex_agent.webrtc.direct.ice_consent import keep_consent
from duplex_agent.webrtc.direct.tracks import PlayoutTrack

PEERS = web.AppKey("peers", dict)
LISTENERS = web.AppKey("listeners", dict)
ICE_ADDRESS = web.AppKey("ice_address", str)
REPLY = web.AppKey("reply", str)
END_SILENCE_MS = web.AppKey("end_silence_ms", float)
RATE = 48000
FRAME = 960
#: The caller's sound: a 5 ms block over -40 dBFS (where the benches' callers stamp their onsets).
ONSET_RMS = 0.01
TONE_MS = 1000.0


def holds_sound(samples: np.ndarray) -> bool:
    blocks = samples[: samples.size // 240 * 240].reshape(-1, 240)
    return bool(blocks.size) and float(np.sqrt((blocks**2).mean(axis=1)).max()) > ONSET_RMS


class ToneReply:
    """One caller's floor agent: a tone after each of the caller's turns, cut at the caller's first sound."""

    def __init__(self, end_silence_ms: float) -> None:
        self.end_silence_s = end_silence_ms / 1000
        t = np.arange(int(RATE * TONE_MS / 1000)) / RATE
        self._tone = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        self._position: int | None = None  # where in the tone the next frame starts; None: quiet
        self._spoke_at: float | None = None  # the caller's last sound of a turn not yet answered

    def hear(self, samples: np.ndarray) -> None:
        now = time.monotonic()
        if holds_sound(samples):
            self._position = None  # barge-in: the next frame out is silence
            self._spoke_at = now
        elif self._spoke_at is not None and now - self._spoke_at >= self.end_silence_s:
            self._spoke_at = None
            self._position = 0

    def next_frame(self) -> np.ndarray:
        frame = np.zeros(FRAME, np.int16)
        if self._position is not None:
            chunk = self._tone[self._position : self._position + FRAME]
            frame[: chunk.size] = chunk
            self._position = None if self._position + FRAME >= self._tone.size else self._position + FRAME
        return frame


def answer_with_tone(pc: RTCPeerConnection, track, end_silence_ms: float, pc_id: str) -> AdaptiveCallerAudioReader:  # noqa: ANN001
    """Sends the tone reply on ``pc``; the returned reader hears ``track`` until the call ends."""
    reply = ToneReply(end_silence_ms)
    pc.addTrack(PlayoutTrack(reply.next_frame))
    receiver = next(t.receiver for t in pc.getTransceivers() if t.receiver.track is track)
    return AdaptiveCallerAudioReader(receiver, lambda samples, rate: reply.hear(samples), call_id=pc_id)


async def offer(request: web.Request) -> web.Response:
    params = await request.json()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc_id = uuid.uuid4().hex
    peers: dict[str, RTCPeerConnection] = request.app[PEERS]
    peers[pc_id] = pc

    @pc.on("track")
    def echo(track) -> None:  # noqa: ANN001
        if track.kind != "audio":
            return
        if request.app[REPLY] == "tone":
            request.app[LISTENERS][pc_id] = answer_with_tone(pc, track, request.app[END_SILENCE_MS], pc_id)
        else:
            pc.addTrack(track)

    @pc.on("connectionstatechange")
    async def gone() -> None:
        if pc.connectionState in ("failed", "closed"):
            peers.pop(pc_id, None)
            await pc.close()
            reader = request.app[LISTENERS].pop(pc_id, None)
            if reader is not None:
                await reader.close()

    await pc.setRemoteDescription(RTCSessionDescription(sdp=params["sdp"], type=params["type"]))
    keep_consent(pc)  # the worker's consent, so that the floor rides out the same stalls
    with candidates_on(request.app[ICE_ADDRESS]):
        await pc.setLocalDescription(await pc.createAnswer())
    return web.json_response({"sdp": pc.localDescription.sdp, "type": pc.localDescription.type, "pc_id": pc_id})


async def metrics(request: web.Request) -> web.Response:
    open_peers = sum(pc.connectionState != "closed" for pc in request.app[PEERS].values())
    return web.Response(text=f'duplex_sessions_active{{transport="all"}} {open_peers}\n')


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "sessions": len(request.app[PEERS])})


def build_app(ice_address: str, reply: str = "echo", end_silence_ms: float = 500.0) -> web.Application:
    app = web.Application()
    app[PEERS] = {}
    app[LISTENERS] = {}
    app[ICE_ADDRESS] = ice_address
    app[REPLY] = reply
    app[END_SILENCE_MS] = end_silence_ms
    app.router.add_post("/api/offer", offer)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)

    async def close_all(app: web.Application) -> None:
        await asyncio.gather(*(pc.close() for pc in app[PEERS].values()), return_exceptions=True)

    app.on_shutdown.append(close_all)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ice-address", default="", help="local address for ICE (default: this machine's interface)")
    parser.add_argument("--reply", choices=("echo", "tone"), default="echo",
                        help="echo the caller back, or answer each turn with a tone the caller's sound cuts")
    parser.add_argument("--end-silence-ms", type=float, default=500.0, help="tone: the caller's silence that ends a turn")
    args = parser.parse_args()
    web.run_app(build_app(args.ice_address or interface_ipv4(), args.reply, args.end_silence_ms), host=args.host,
                port=args.port, print=None)


if __name__ == "__main__":
    main()
