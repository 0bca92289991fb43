"""LoopbackLiveKitServer: the server on a thread and event loop of its own.

A test's own work (a Whisper call, a blocking read) must not stall forwarding, as it
cannot stall a real LiveKit server. Every call goes into the server's loop; what a test
reads comes back as an immutable snapshot (``views``), taken there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import auth
from .agent_dispatch import DispatchRecord, JobRecord, WorkerRecord
from .media_relay import Arrival, Hop
from .net import signal_url
from .server import ServerCore
from .sip import CallRecord, Phone, Transfer
from .views import RoomView, record_copy, room_view

T = TypeVar("T")

#: How long a read of the server's state may wait for its loop.
READ_TIMEOUT_S = 10.0


class LoopbackLiveKitServer:
    """In-process LiveKit server for tests, served from its own thread (see the package
    docstring for versions)."""

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
        self.api_secret = api_secret
        self.host = host
        self.port = port
        self.ip = ""
        self.signal_host = ""
        self._core_args = dict(api_key=api_key, api_secret=api_secret, host=host, port=port,
                               advertise_ip=advertise_ip, departure_timeout=departure_timeout,
                               single_pc=single_pc)
        self._core: ServerCore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------
    @property
    def url(self) -> str:
        return signal_url(self.signal_host, self.port)

    async def start(self) -> LoopbackLiveKitServer:
        loop_ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(loop_ready,),
                                        name="loopback-livekit-server", daemon=True)
        self._thread.start()
        self._loop = await asyncio.wrap_future(loop_ready)
        try:
            self._core = await self._call(self._start_core)
        except BaseException:
            await self.stop()
            raise
        self.port, self.ip, self.signal_host = self._core.port, self._core.ip, self._core.signal_host
        return self

    async def _start_core(self) -> ServerCore:
        return await ServerCore(**self._core_args).start()

    @staticmethod
    def _serve(loop_ready: concurrent.futures.Future) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop_ready.set_result(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def stop(self) -> None:
        if self._thread is None:
            return
        try:
            if self._core is not None:
                await self._call(self._core.stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._thread = self._core = None

    async def __aenter__(self) -> LoopbackLiveKitServer:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- crossing into the server's loop ------------------------------------
    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), self._loop))

    def _read(self, fn: Callable[[ServerCore], T]) -> T:
        """``fn(core)`` run on the server's loop (it must return a snapshot); blocks the caller."""
        async def _on_loop() -> T:
            return fn(self._core)

        return asyncio.run_coroutine_threadsafe(_on_loop(), self._loop).result(READ_TIMEOUT_S)

    # -- tokens -----------------------------------------------------------
    def mint_token(self, identity: str, room: str, *, name: str | None = None, kind: str | None = None,
                   attributes: dict[str, str] | None = None, metadata: str | None = None,
                   agent: bool = False) -> str:
        return auth.mint_token(self.api_key, self.api_secret, identity, room, name=name, kind=kind,
                               attributes=attributes, metadata=metadata, agent=agent)

    # -- state, as snapshots ----------------------------------------------
    @property
    def rooms(self) -> dict[str, RoomView]:
        return self._read(lambda core: {name: room_view(r) for name, r in core.rooms.items()})

    @property
    def closed_rooms(self) -> list[str]:
        return self._read(lambda core: list(core.closed_rooms))

    @property
    def workers(self) -> dict[str, WorkerRecord]:
        return self._read(lambda core: {k: record_copy(v) for k, v in core.workers.items()})

    @property
    def jobs(self) -> dict[str, JobRecord]:
        return self._read(lambda core: {k: record_copy(v) for k, v in core.jobs.items()})

    @property
    def dispatches(self) -> dict[str, DispatchRecord]:
        return self._read(lambda core: {k: record_copy(v) for k, v in core.dispatches.items()})

    def forwarding(self) -> tuple[tuple[Arrival, ...], tuple[Hop, ...]]:
        """The server's per-packet record: each audio packet's arrival, and each hop
        (arrival to send) to one subscriber."""
        return self._read(lambda core: (tuple(core.forwarding.arrivals), tuple(core.forwarding.hops)))

    def forwarding_summary(self) -> str:
        """Per audio track: packets in, packets out to each subscriber, and how long ago each last went."""
        return "\n".join(self._read(lambda core: core.forwarding.summary(time.perf_counter_ns())))

    def http_requests(self) -> tuple[tuple[str, str, int], ...]:
        """Every HTTP request the server has answered so far: (method, path, status)."""
        return self._read(lambda core: tuple(core.http.requests))

    # -- actions ----------------------------------------------------------
    async def close_room(self, name: str) -> None:
        """Send Leave(ROOM_DELETED) to everyone and drop the room (fault tests)."""
        await self._call(self._core.close_room, name)

    async def remove_participant(self, room: str, identity: str) -> None:
        await self._call(self._core.remove_participant, room, identity)

    async def lose_packets(self, room: str, identity: str, count: int = 1) -> None:
        """Drop the next ``count`` audio packets from ``identity`` on arrival (fault tests)."""
        async def _lose() -> None:
            self._core.lose_packets(room, identity, count)

        await self._call(_lose)

    async def create_dispatch(self, room: str, agent_name: str, metadata: str = "") -> LiveDispatch:
        async def _create() -> str:
            return (await self._core.create_dispatch(room, agent_name, metadata)).id

        return LiveDispatch(self, await self._call(_create))

    async def terminate_job(self, job_id: str) -> bool:
        return await self._call(self._core.terminate_job, job_id)

    # -- the SIP service ----------------------------------------------------
    async def add_sip_trunk(self, numbers: tuple[str, ...] = ("+15550100000",), address: str = "sip.loopback.invalid") -> str:
        """An outbound trunk (as CreateSIPOutboundTrunk makes one); its id."""
        async def _add() -> str:
            return self._core.sip.add_trunk(list(numbers), address)

        return await self._call(_add)

    async def add_phone(self, number: str, phone: Phone) -> None:
        """The phone the SIP service reaches at ``number`` (a call to any other number gets 404)."""
        async def _add() -> None:
            self._core.sip.add_phone(number, phone)

        await self._call(_add)

    def sip_calls(self) -> dict[str, CallRecord]:
        """Every outbound call so far, by call id, as it stands (a snapshot)."""
        return self._core.sip.snapshot()

    def sip_call_to(self, number: str) -> CallRecord | None:
        """The latest call to ``number``, as it stands."""
        calls = [c for c in self.sip_calls().values() if c.number == number]
        return calls[-1] if calls else None

    def sip_transfers(self) -> list[Transfer]:
        return self._read(lambda core: list(core.sip.transfers))

    def twirp_calls(self) -> list[tuple[str, str]]:
        """Every server API call so far: (Service/Method, its twirp error code or "ok")."""
        return self._read(lambda core: list(core.twirp.calls))

    async def phone_say(self, call_id: str, audio) -> None:
        """The far end says ``audio`` (48 kHz float32) down its line, after what it is saying."""
        await self._core.sip.act(call_id, "say", audio)

    async def phone_press(self, call_id: str, digits: str) -> None:
        await self._core.sip.act(call_id, "press", digits)

    async def phone_hang_up(self, call_id: str) -> None:
        await self._core.sip.act(call_id, "hang_up")

    async def wait_for_worker(self, agent_name: str, *, available: bool = False,
                              timeout: float = 10.0) -> WorkerRecord:
        async def _wait() -> WorkerRecord:
            return record_copy(await self._core.wait_for_worker(
                agent_name, available=available, timeout=timeout))

        return await self._call(_wait)

    async def wait_for_job_status(self, job_id: str, status: int, timeout: float = 10.0) -> None:
        await self._call(lambda: self._core.wait_for_job_status(job_id, status, timeout))


class LiveDispatch:
    """A dispatch whose fields (``state``, ``job_id``, ...) read the server's record as it
    stands now, as the record itself does on the server's loop."""

    def __init__(self, server: LoopbackLiveKitServer, dispatch_id: str) -> None:
        self.id = dispatch_id
        self._server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server.dispatches[self.id], name)
