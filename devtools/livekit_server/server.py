"""ServerCore: aiohttp app wiring signal, rooms and agent dispatch together, on one event loop
(``LoopbackLiveKitServer`` runs it on a thread of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from . import auth, signal
from .agent_dispatch import AgentDispatcher, DispatchRecord, JobRecord, WorkerRecord
from .ids import new_sid
from .media_relay import AudioForwarder, ForwardingRecord
from .net import interface_ipv4, is_loopback, signal_url
from .room import Room
from .room_api import RoomApi
from .sip import SipService
from .twirp import TwirpRouter

log = logging.getLogger(__name__)


@web.middleware
async def _allow_any_origin(request: web.Request, handler: Any) -> web.StreamResponse:
    """CORS for every origin, as livekit-server does: livekit-client (browser) fetches
    /rtc/v1/validate and /rtc/validate cross-origin to explain a failed websocket upgrade
    (404 -> fall back to /rtc, 401 -> bad token); without this header it reads "unreachable"."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers["Access-Control-Allow-Origin"] = "*"
        raise
    if not response.prepared:  # a websocket response is already under way
        response.headers["Access-Control-Allow-Origin"] = "*"
    return response


class RequestRecord:
    """What every HTTP request got (method, path, status; 101 for a websocket taken): an SDK
    that asks for a path this server lacks shows as a 404 here."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int]] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.requests.append((request.method, request.path, exc.status))
            raise
        self.requests.append((request.method, request.path, response.status))
        return response


class ServerCore:
    """The LiveKit server (see package docstring for versions); all of it runs on the loop
    that started it."""

    def __init__(
        self,
        api_key: str = "devkey",
        api_secret: str = "secret",
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        advertise_ip: str | None = None,
        departure_timeout: float = 1.0,
        single_pc: bool = True,
    ) -> None:
        self.api_key = api_key
        #: False: no /rtc/v1, as a LiveKit server older than v1; SDKs then join on /rtc with two peer connections
        self.single_pc = single_pc
        self.api_secret = api_secret
        self.host = host
        self.port = port
        wildcard = host in ("", "0.0.0.0", "::")
        # Media: the address ICE candidates must be on. aiortc's ICE skips loopback, so a server
        # that listens on loopback still relays media on the machine's interface.
        self.ip = advertise_ip or (interface_ipv4() if wildcard or is_loopback(host) else host)
        #: Where clients reach the signal server: the address it listens on (the media address
        #: when that is every interface).
        self.signal_host = self.ip if wildcard else host
        self.node_id = new_sid("ND_")
        self.departure_timeout = departure_timeout
        self.rooms: dict[str, Room] = {}
        self.closed_rooms: list[str] = []
        self.forwarding = ForwardingRecord()
        self.http = RequestRecord()
        self._dispatcher = AgentDispatcher(self)
        self.twirp = TwirpRouter(api_key, api_secret)
        RoomApi(self).register(self.twirp)
        self.sip = SipService(self)
        self.sip.register(self.twirp)
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle --------------------------------------------------------
    @property
    def url(self) -> str:
        return signal_url(self.signal_host, self.port)

    @property
    def allowed_ips(self) -> set[str]:
        # ICE candidates we are willing to send to (this machine only)
        return {self.ip}

    async def start(self) -> ServerCore:
        app = web.Application(middlewares=[self.http.middleware, _allow_any_origin])
        app.router.add_get("/", self._health)
        app.router.add_get("/rtc", lambda r: signal.rtc_socket(self, r))
        app.router.add_get("/rtc/validate", lambda r: signal.validate(self, r))
        if self.single_pc:
            app.router.add_get("/rtc/v1", lambda r: signal.rtc_v1_socket(self, r))
            app.router.add_get("/rtc/v1/validate", lambda r: signal.validate_v1(self, r))
        app.router.add_get("/agent", self._dispatcher.handle_ws)
        self.twirp.register(app)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        log.info("loopback livekit server at %s", self.url)
        return self

    async def stop(self) -> None:
        await self.sip.aclose()
        for room in list(self.rooms.values()):
            await room.close()
        await self._dispatcher.aclose()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 3)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="OK")

    def track_socket(self, ws: web.WebSocketResponse) -> None:
        self._sockets.add(ws)

    def untrack_socket(self, ws: web.WebSocketResponse) -> None:
        self._sockets.discard(ws)

    def _spawn(self, coro, name: str) -> None:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- rooms ------------------------------------------------------------
    def get_or_create_room(self, name: str) -> tuple[Room, bool]:
        room = self.rooms.get(name)
        if room is not None and not room.closed:
            return room, False
        room = Room(name, on_closed=self._on_room_closed, departure_timeout=self.departure_timeout,
                    forwarding=self.forwarding)
        self.rooms[name] = room
        return room, True

    def on_room_created(self, room: Room, grant: auth.JoinGrant) -> None:
        self._spawn(
            self._dispatcher.auto_dispatch(room.name, grant.agent_dispatches), "lk-auto-dispatch"
        )

    async def _on_room_closed(self, room: Room) -> None:
        if self.rooms.get(room.name) is room:
            del self.rooms[room.name]
        self.closed_rooms.append(room.name)
        await self._dispatcher.on_room_closed(room.name)

    async def close_room(self, name: str) -> None:
        """Send Leave(ROOM_DELETED) to everyone and drop the room (fault tests)."""
        room = self.rooms.get(name)
        if room is not None:
            await room.close()

    async def remove_participant(self, room: str, identity: str) -> None:
        from livekit.protocol import models, rtc

        r = self.rooms.get(room)
        p = r.participants.get(identity) if r else None
        if p is None:
            return
        await p.send(rtc.SignalResponse(leave=rtc.LeaveRequest(
            reason=models.DisconnectReason.PARTICIPANT_REMOVED,
            action=rtc.LeaveRequest.Action.DISCONNECT)))
        await r.remove_participant(p, models.DisconnectReason.PARTICIPANT_REMOVED)

    def lose_packets(self, room: str, identity: str, count: int = 1) -> None:
        """Drop the next ``count`` packets of each audio track ``identity`` publishes, on
        arrival, as if lost on its uplink (fault tests)."""
        r = self.rooms.get(room)
        p = r.participants.get(identity) if r else None
        if p is None:
            raise KeyError(f"{identity!r} is not in room {room!r}")
        for pt in p.tracks.values():
            if isinstance(pt.fanout, AudioForwarder):
                pt.fanout.lose(count)

    # -- agents -----------------------------------------------------------
    @property
    def workers(self) -> dict[str, WorkerRecord]:
        return self._dispatcher.workers

    @property
    def jobs(self) -> dict[str, JobRecord]:
        return self._dispatcher.jobs

    @property
    def dispatches(self) -> dict[str, DispatchRecord]:
        return self._dispatcher.dispatches

    async def create_dispatch(self, room: str, agent_name: str, metadata: str = "") -> DispatchRecord:
        return await self._dispatcher.create_dispatch(room, agent_name, metadata)

    async def terminate_job(self, job_id: str) -> bool:
        return await self._dispatcher.terminate_job(job_id)

    async def wait_for_worker(
        self, agent_name: str, *, available: bool = False, timeout: float = 10.0
    ) -> WorkerRecord:
        def _find() -> WorkerRecord | None:
            for w in self.workers.values():
                if w.agent_name == agent_name and (w.available or not available):
                    return w
            return None

        await self._dispatcher.wait_for(lambda: _find() is not None, timeout)
        w = _find()
        assert w is not None
        return w

    async def wait_for_job_status(self, job_id: str, status: int, timeout: float = 10.0) -> None:
        await self._dispatcher.wait_for(
            lambda: job_id in self.jobs and self.jobs[job_id].status == status, timeout
        )
