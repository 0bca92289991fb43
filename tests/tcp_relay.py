"""A loopback TCP relay whose live connections a test can cut, as a dropped network would.

``TcpRelay`` runs in the test's own event loop. ``RelayThread`` runs one on a thread of its
own, for module fixtures that outlive each test's loop. ``cut()`` aborts every relayed
connection at once, both ways, with no close handshake: a lost network, not a goodbye.
``swallow_upstream()`` first makes what the client writes vanish on the way (taken, never
passed on), so a test can cut a link with client messages certainly in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._live: set[tuple[asyncio.Transport, asyncio.Transport]] = set()
        self._swallowing = False
        self.swallowed = 0  # bytes taken from clients and never passed on

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, upstream_writer.transport)
        self._live.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, upstream_writer, upstream=True), self._pipe(upstream_reader, writer))
        finally:
            self._live.discard(pair)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                if upstream and self._swallowing:
                    self.swallowed += len(data)
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    def swallow_upstream(self) -> None:
        """From now on, drop what clients write instead of passing it on (until ``cut``)."""
        self._swallowing = True

    def cut(self) -> int:
        """Abort every relayed connection now; the number cut."""
        live = list(self._live)
        for pair in live:
            for transport in pair:
                transport.abort()
        self._live.clear()
        self._swallowing = False
        return len(live)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


class RelayThread:
    """A ``TcpRelay`` on its own thread and event loop; every call blocks until done there."""

    def __init__(self, target_port: int) -> None:
        self.relay = TcpRelay(target_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-relay", daemon=True)

    @property
    def port(self) -> int:
        return self.relay.port

    @property
    def connections(self) -> int:
        return self.relay.connections

    def start(self) -> RelayThread:
        self._thread.start()
        self._run(self.relay.start())
        return self

    @property
    def swallowed(self) -> int:
        return self.relay.swallowed

    def swallow_upstream(self) -> None:
        self.loop_call(self.relay.swallow_upstream)

    def cut(self) -> int:
        """Abort every relayed connection now; the number cut."""
        async def cut() -> int:
            return self.relay.cut()
        return self._run(cut())

    def stop(self) -> None:
        async def stop() -> None:
            await self.relay.stop()
            pipes = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def loop_call(self, function) -> None:
        """Run ``function()`` on the relay's loop and wait for it."""
        async def call() -> None:
            function()
        self._run(call())

    def _run(self, step):
        return asyncio.run_coroutine_threadsafe(step, self._loop).result(10)
