"""Agent worker protocol (/agent websocket): registration, status, dispatch, termination."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from livekit.protocol import agent

from . import auth
from .ids import new_sid

if TYPE_CHECKING:
    from .server import ServerCore

log = logging.getLogger(__name__)

AVAILABILITY_TIMEOUT = 5.0


@dataclass
class WorkerRecord:
    id: str
    agent_name: str
    job_type: int
    version: str = ""
    status: int = agent.WorkerStatus.WS_AVAILABLE
    load: float = 0.0
    job_count: int = 0
    draining: bool = False
    connected: bool = True
    registered_at: float = field(default_factory=time.time)
    jobs: set[str] = field(default_factory=set)
    ws: web.WebSocketResponse | None = field(default=None, repr=False)
    _pending: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)

    @property
    def available(self) -> bool:
        return (
            self.connected
            and not self.draining
            and self.status == agent.WorkerStatus.WS_AVAILABLE
            and self.load < 1.0
        )

    async def send(self, msg: agent.ServerMessage) -> None:
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_bytes(msg.SerializeToString())


@dataclass
class JobRecord:
    id: str
    dispatch_id: str
    room: str
    agent_name: str
    metadata: str
    worker_id: str
    participant_identity: str = ""
    status: int = agent.JobStatus.JS_PENDING
    error: str = ""
    terminated: bool = False


@dataclass
class DispatchRecord:
    id: str
    room: str
    agent_name: str
    metadata: str
    state: str = "pending"  # pending | assigned | no_worker (retried later) | cancelled
    job_id: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (worker id, reason)
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


class AgentDispatcher:
    def __init__(self, server: ServerCore) -> None:
        self._server = server
        self.workers: dict[str, WorkerRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.dispatches: dict[str, DispatchRecord] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._changed = asyncio.Condition()

    def _spawn(self, coro, name: str) -> None:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate, timeout: float) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    # -- websocket --------------------------------------------------------
    async def handle_ws(self, request: web.Request) -> web.StreamResponse:
        authz = request.headers.get("Authorization", "")
        token = authz[7:].strip() if authz.lower().startswith("bearer ") else ""
        try:
            claims = auth.verify(self._server.api_key, self._server.api_secret, token)
            if claims.video is None or not claims.video.agent:
                raise auth.AuthError("missing agent grant")
        except auth.AuthError as e:
            return web.Response(status=401, text=str(e))

        ws = web.WebSocketResponse(max_msg_size=0, timeout=2.0)
        await ws.prepare(request)
        self._server.track_socket(ws)
        worker: WorkerRecord | None = None
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                        break
                    continue
                wm = agent.WorkerMessage()
                try:
                    wm.ParseFromString(msg.data)
                except Exception:
                    continue
                which = wm.WhichOneof("message")
                if which == "register":
                    worker = await self._register(ws, wm.register)
                elif worker is None:
                    continue
                elif which == "update_worker":
                    self._update_worker(worker, wm.update_worker)
                elif which == "availability":
                    fut = worker._pending.pop(wm.availability.job_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(wm.availability)
                elif which == "update_job":
                    job = self.jobs.get(wm.update_job.job_id)
                    if job is not None:
                        job.status = wm.update_job.status
                        job.error = wm.update_job.error
                elif which == "ping":
                    now = int(time.time() * 1000)
                    await worker.send(agent.ServerMessage(
                        pong=agent.WorkerPong(last_timestamp=wm.ping.timestamp, timestamp=now)))
                await self._notify()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("agent worker socket failed")
        finally:
            log.debug("worker socket closed: %s close_code=%s", worker and worker.id, ws.close_code)
            self._server.untrack_socket(ws)
            if worker is not None:
                worker.connected = False
                worker.ws = None
                for fut in worker._pending.values():
                    if not fut.done():
                        fut.cancel()
                self.workers.pop(worker.id, None)
                await self._notify()
            if not ws.closed:
                await ws.close()
        return ws

    async def _register(
        self, ws: web.WebSocketResponse, req: agent.RegisterWorkerRequest
    ) -> WorkerRecord:
        from .signal import server_info

        worker = WorkerRecord(
            id=new_sid("AW_"), agent_name=req.agent_name, job_type=req.type, version=req.version,
            ws=ws,
        )
        self.workers[worker.id] = worker
        await worker.send(agent.ServerMessage(register=agent.RegisterWorkerResponse(
            worker_id=worker.id, server_info=server_info(self._server.node_id))))
        self._spawn(self._retry_pending(), "lk-retry-dispatch")
        return worker

    def _update_worker(self, worker: WorkerRecord, upd: agent.UpdateWorkerStatus) -> None:
        was_available = worker.available
        worker.status = upd.status
        worker.load = upd.load
        worker.job_count = upd.job_count
        worker.draining = upd.draining
        if worker.available and not was_available:
            self._spawn(self._retry_pending(), "lk-retry-dispatch")

    # -- dispatch ---------------------------------------------------------
    async def create_dispatch(self, room: str, agent_name: str, metadata: str = "") -> DispatchRecord:
        d = DispatchRecord(id=new_sid("AD_"), room=room, agent_name=agent_name, metadata=metadata)
        self.dispatches[d.id] = d
        self._server.get_or_create_room(room)
        await self._try_dispatch(d)
        return d

    async def _retry_pending(self) -> None:
        for d in list(self.dispatches.values()):
            if d.state == "no_worker":
                await self._try_dispatch(d)

    async def _try_dispatch(self, d: DispatchRecord) -> None:
        async with self._lock:
            if d.state == "assigned":
                return
            room = self._server.rooms.get(d.room)
            if room is None or room.closed:
                d.state = "cancelled"
                d.done.set()
                return
            for w in list(self.workers.values()):
                if w.agent_name != d.agent_name or w.job_type != agent.JobType.JT_ROOM:
                    continue
                if not w.available:
                    reason = "full" if w.status == agent.WorkerStatus.WS_FULL else (
                        "draining" if w.draining else f"load={w.load:.2f}")
                    d.skipped.append((w.id, reason))
                    continue
                if await self._offer(w, d, room):
                    d.state = "assigned"
                    d.done.set()
                    await self._notify()
                    return
            d.state = "no_worker"
            d.done.set()
            await self._notify()

    async def _offer(self, w: WorkerRecord, d: DispatchRecord, room) -> bool:
        job = agent.Job(
            id=new_sid("AJ_"), dispatch_id=d.id, type=agent.JobType.JT_ROOM, room=room.info(),
            agent_name=d.agent_name, metadata=d.metadata,
            state=agent.JobState(status=agent.JobStatus.JS_PENDING, worker_id=w.id,
                                 updated_at=int(time.time() * 1e9)),
        )
        fut = asyncio.get_running_loop().create_future()
        w._pending[job.id] = fut
        try:
            await w.send(agent.ServerMessage(availability=agent.AvailabilityRequest(job=job)))
            resp: agent.AvailabilityResponse = await asyncio.wait_for(fut, AVAILABILITY_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError, ConnectionError):
            w._pending.pop(job.id, None)
            d.skipped.append((w.id, "no availability answer"))
            return False
        if not resp.available:
            d.skipped.append((w.id, "rejected"))
            return False
        identity = resp.participant_identity or f"agent-{job.id}"
        attrs = dict(resp.participant_attributes)
        token = auth.mint_token(
            self._server.api_key, self._server.api_secret, identity, d.room,
            name=resp.participant_name or None, metadata=resp.participant_metadata or None,
            attributes=attrs or None, kind="agent", agent=True,
        )
        job.state.status = agent.JobStatus.JS_RUNNING
        job.state.participant_identity = identity
        await w.send(agent.ServerMessage(assignment=agent.JobAssignment(
            job=job, url=self._server.url, token=token)))
        rec = JobRecord(id=job.id, dispatch_id=d.id, room=d.room, agent_name=d.agent_name,
                        metadata=d.metadata, worker_id=w.id, participant_identity=identity)
        self.jobs[job.id] = rec
        w.jobs.add(job.id)
        d.job_id = job.id
        return True

    async def auto_dispatch(self, room: str, token_dispatches: list[tuple[str, str]]) -> None:
        """Room created: token-configured dispatches, else any worker without agent_name."""
        if token_dispatches:
            for name, metadata in token_dispatches:
                await self.create_dispatch(room, name, metadata)
        elif any(w.agent_name == "" for w in self.workers.values()):
            await self.create_dispatch(room, "", "")

    # -- termination ------------------------------------------------------
    async def terminate_job(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.terminated:
            return False
        job.terminated = True
        w = self.workers.get(job.worker_id)
        if w is not None:
            with contextlib.suppress(ConnectionError):
                await w.send(agent.ServerMessage(termination=agent.JobTermination(job_id=job_id)))
        return True

    async def on_room_closed(self, room: str) -> None:
        for job in list(self.jobs.values()):
            if job.room == room and not job.terminated:
                await self.terminate_job(job.id)
        for d in self.dispatches.values():
            if d.room == room and d.state == "no_worker":
                d.state = "cancelled"

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
