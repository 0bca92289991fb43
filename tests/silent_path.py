"""A loopback TCP path that can go silent: what a server sees when its client's network drops with
no reset (a phone leaving Wi-Fi, a NAT that forgot the flow).

``SilentPath`` relays connections to a target port until ``go_silent``: from then on nothing passes
either way and nothing is read, so what the server sends backs up in its socket buffers, and its
side of the connection stays open. The path's own receive buffers are small, so that happens after
kilobytes, not megabytes. With ``reset_clients`` the client's leg is aborted at the same moment: the
client sees its connection drop (and can resume on a new one) while the server's stays open and
silent. New connections after that pass normally. Plain asyncio and the standard library only: it
also runs in vLLM-Omni's venv (``devtools.omni_peer.duplex_client_run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

#: The path's receive buffer toward the server: small, so the server's sends back up soon after the silence.
RECEIVE_BUFFER_BYTES = 4096


class SilentPath:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        #: Every connection: (client leg, server leg, flowing until ``go_silent``).
        self._legs: list[tuple[asyncio.Transport, asyncio.Transport, asyncio.Event]] = []

    async def start(self) -> SilentPath:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, path_and_query: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path_and_query}"

    def go_silent(self, *, reset_clients: bool = False) -> int:
        """Stop every live connection both ways, leaving them open; the number silenced."""
        silenced = 0
        for client, _, flowing in self._legs:
            if flowing.is_set():
                silenced += 1
                flowing.clear()
                if reset_clients:
                    client.abort()
        return silenced

    async def close(self) -> None:
        for client, upstream, flowing in self._legs:
            flowing.clear()
            client.abort()
            upstream.abort()
        if self._server is not None:
            self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)  # before connect: the window
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.target_port))
            up_reader, up_writer = await asyncio.open_connection(sock=sock, limit=RECEIVE_BUFFER_BYTES)
        except OSError:
            sock.close()
            writer.transport.abort()
            return
        flowing = asyncio.Event()
        flowing.set()
        self._legs.append((writer.transport, up_writer.transport, flowing))  # type: ignore[arg-type]
        await asyncio.gather(self._pipe(reader, up_writer, flowing), self._pipe(up_reader, writer, flowing),
                             return_exceptions=True)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                await flowing.wait()
                data = await source.read(RECEIVE_BUFFER_BYTES)
                if not data:
                    break
                await flowing.wait()  # gone silent while reading: this never arrives
                sink.write(data)
                await sink.drain()
        if flowing.is_set():
            sink.transport.abort()
