"""A loopback TCP relay between our server and the vLLM-Omni peer, whose connections a test can cut.

It runs its own event loop on a thread (module fixtures outlive each test's loop). ``drop()``
aborts every relayed connection at once, both ways, with no close frame: a network blip on
the agent->vLLM-Omni hop.
"""

from __future__ import annotations

import asyncio
import threading


class TcpRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-relay", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.Transport] = set()

    def start(self) -> TcpRelay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, upstream_writer.transport)
        self._open.update(pair)
        try:
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        finally:
            self._open.difference_update(pair)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    def drop(self) -> int:
        """Abort every relayed connection now; the number cut."""
        async def cut() -> int:
            live = list(self._open)
            for transport in live:
                transport.abort()
            return len(live) // 2
        return asyncio.run_coroutine_threadsafe(cut(), self._loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            for transport in list(self._open):
                transport.abort()
            if self._server is not None:
                self._server.close()
            relays = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
