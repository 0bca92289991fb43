"""The transport floor: bare aiortc peers that send each caller's audio straight back.

Speaks the worker's ``POST /api/offer`` (so the same callers connect to it) and
serves ``/metrics`` with the one figure the benches read from it, the open peers.
No model, no resampling, no VAD: what a call costs aiortc as shipped (its decoder
thread, its Opus encoder, SRTP, ICE). Run as its own process by ``bench.call_rounds``.

Run: python -m bench.echo_peer --port 8090 [--ice-address A.B.C.D]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from duplex_agent.webrtc.direct.host_address import candidates_on, interface_ipv4

PEERS = web.AppKey("peers", dict)


async def offer(request: web.Request) -> web.Response:
    params = await request.json()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc_id = uuid.uuid4().hex
    peers: dict[str, RTCPeerConnection] = request.app[PEERS]
    peers[pc_id] = pc

    @pc.on("track")
    def echo(track) -> None:  # noqa: ANN001
        if track.kind == "audio":
            pc.addTrack(track)

    @pc.on("connectionstatechange")
    async def gone() -> None:
        if pc.connectionState in ("failed", "closed"):
            peers.pop(pc_id, None)
            await pc.close()

    await pc.setRemoteDescription(RTCSessionDescription(sdp=params["sdp"], type=params["type"]))
    with candidates_on(request.app["ice_address"]):
        await pc.setLocalDescription(await pc.createAnswer())
    return web.json_response({"sdp": pc.localDescription.sdp, "type": pc.localDescription.type, "pc_id": pc_id})


async def metrics(request: web.Request) -> web.Response:
    open_peers = sum(pc.connectionState != "closed" for pc in request.app[PEERS].values())
    return web.Response(text=f'duplex_sessions_active{{transport="all"}} {open_peers}\n')


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "sessions": len(request.app[PEERS])})


def build_app(ice_address: str) -> web.Application:
    app = web.Application()
    app[PEERS] = {}
    app["ice_address"] = ice_address
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
    args = parser.parse_args()
    web.run_app(build_app(args.ice_address or interface_ipv4()), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
