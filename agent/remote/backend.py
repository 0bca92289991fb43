"""The remote backend: conversations on a vLLM-Omni duplex server (or our own endpoint).

``start()`` opens a probe session to learn the model's capabilities; each
``open()`` is one websocket to ``/v1/realtime?duplex=1`` (see
``agent.remote.conversation``). Refusals -- HTTP 503, an ``error`` such as
``resource_exhausted``, a close before ``session.created`` -- become
``AdmissionError`` with the code.

Event loops: a LiveKit worker runs each job on its own thread with its own
loop, and an aiohttp ``ClientSession`` (its connector, its timers) belongs to
the loop that made it. So every conversation gets its own ``ClientSession``,
made in the loop that opens the conversation and closed when it ends; no
network object is ever shared between loops. What is shared -- the live
conversations (with their loops), the admission count, the server's free
capacity -- sits behind one lock, so admission is atomic across threads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import aiohttp
from yarl import URL

from duplex_agent.agent.remote.capacity import ServerCapacity
from duplex_agent.agent.remote.conversation import RemoteConversation, RemoteOptions
from duplex_agent.agent.session.ports import BUSY_CODES, AdmissionError, DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.plugins.contract.loops import run_in_owner_loops

_HTTP_CODES = {503: "resource_exhausted", 429: "resource_exhausted", 401: "backend_unauthorized",
               403: "backend_unauthorized"}
#: How long ``close()`` waits for a conversation living on another loop to close.
_CROSS_LOOP_CLOSE_S = 5.0


class RemoteBackend(DuplexBackend):
    def __init__(
        self,
        url: str,
        *,
        model: str = "",
        api_key: str = "",
        max_sessions: int = 8,
        session: dict[str, Any] | None = None,
        options: RemoteOptions | None = None,
    ) -> None:
        """``session``: fields every session opens with (e.g. ``instructions``, or ``ref_audio`` for MiniCPM-o)."""
        self.url = URL(url)
        self.model = model
        self.max_sessions = max_sessions
        self.options = options or RemoteOptions()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session_defaults = dict(session or {})
        self._capabilities: DuplexCapabilities | None = None
        self.capacity = ServerCapacity()
        self._lock = threading.Lock()
        #: live conversations and the loop each one lives in
        self._conversations: dict[RemoteConversation, asyncio.AbstractEventLoop] = {}
        #: closes of per-conversation client sessions, still finishing (each in its conversation's loop)
        self._http_closing: set[asyncio.Task[None]] = set()
        self._opening = 0
        self._admitting = True
        self._probe: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Learn the server's capabilities from a probe session (closed at once); start reading its capacity."""
        probe = await self.open()
        await probe.close("probe")
        self.watch_capacity()

    def watch_capacity(self) -> None:
        """Start reading the server's capacity, in the running loop (once)."""
        if self._probe is None:
            self._probe = asyncio.create_task(self.capacity.probe(self.url, self._headers),
                                              name="remote-capacity-probe")

    @property
    def started(self) -> bool:
        return self._capabilities is not None

    async def close(self) -> None:
        """Close every live conversation, each in its own loop (``session.closed`` with reason ``shutdown``)."""
        with self._lock:
            self._admitting = False
            live = list(self._conversations.items())
        await run_in_owner_loops(((loop, functools.partial(conversation.close, "shutdown")) for conversation, loop in live),
                                 timeout_s=_CROSS_LOOP_CLOSE_S)
        here = asyncio.get_running_loop()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
            self._probe = None
        with self._lock:
            mine = [task for task in self._http_closing if task.get_loop() is here]
        await asyncio.gather(*mine, return_exceptions=True)

    @property
    def capabilities(self) -> DuplexCapabilities:
        if self._capabilities is None:
            raise RuntimeError("RemoteBackend.capabilities is known after `await backend.start()`")
        return self._capabilities

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._conversations) + self._opening

    @property
    def server_free_sessions(self) -> int | None:
        """Sessions the server will still take (None when it does not say); a LiveKit worker's load uses it."""
        return self.capacity.free_sessions

    def stop_admitting(self) -> None:
        with self._lock:
            self._admitting = False

    async def open(self) -> RemoteConversation:
        with self._lock:  # check and claim a slot in one step: jobs open from several threads at once
            if not self._admitting:
                raise AdmissionError("this worker is shutting down", code="shutting_down")
            if len(self._conversations) + self._opening >= self.max_sessions:
                raise AdmissionError(f"all {self.max_sessions} remote sessions are in use; try again later")
            self._opening += 1
        self.capacity.claimed()
        loop = asyncio.get_running_loop()
        http = aiohttp.ClientSession()
        conversation: RemoteConversation | None = None
        try:
            session = dict(self._session_defaults)
            session.setdefault("input_audio_format", "pcm16")
            if self.model:
                session["model"] = self.model
            conversation = await RemoteConversation.open(
                functools.partial(self._connect, http), session, model=self.model, max_sessions=self.max_sessions,
                options=self.options, on_close=functools.partial(self._closed, http),
            )
        except AdmissionError as exc:
            if exc.code in BUSY_CODES:
                self.capacity.refused()
            raise
        finally:
            with self._lock:
                self._opening -= 1
                if conversation is not None:  # no await since it opened: it cannot have closed yet
                    self._conversations[conversation] = loop
            if conversation is None:
                await http.close()
        self._capabilities = conversation.capabilities
        return conversation

    def _closed(self, http: aiohttp.ClientSession, conversation: RemoteConversation) -> None:
        """A conversation ended (in its own loop): forget it and close its client session there."""
        closing = asyncio.get_running_loop().create_task(http.close(), name="remote-http-close")
        with self._lock:
            self._conversations.pop(conversation, None)
            self._http_closing.add(closing)
        closing.add_done_callback(self._http_closed)
        self.capacity.session_ended()

    def _http_closed(self, task: asyncio.Task[None]) -> None:
        with self._lock:
            self._http_closing.discard(task)

    async def _connect(self, http: aiohttp.ClientSession, *, resume: bool) -> aiohttp.ClientWebSocketResponse:
        """A websocket to the server; AdmissionError with a code when it cannot be had."""
        url = self.url.update_query(autostart="0") if resume else self.url  # vLLM-Omni: resume-only socket
        try:
            # The whole handshake is bounded: a host that takes the TCP connection and never answers is gone.
            # Pings are the connection's own (``ServerConnection``): it answers them and watches the pongs.
            return await asyncio.wait_for(http.ws_connect(
                url, headers=self._headers, max_msg_size=16 << 20,
                timeout=aiohttp.ClientWSTimeout(ws_close=2.0), autoping=False,
            ), self.options.connect_timeout_s)
        except TimeoutError:
            raise AdmissionError(f"no websocket handshake from the duplex server at {self.url} within "
                                 f"{self.options.connect_timeout_s:g} s", code="backend_timeout") from None
        except aiohttp.WSServerHandshakeError as exc:
            code = _HTTP_CODES.get(exc.status, "backend_unavailable")
            raise AdmissionError(f"the duplex server at {self.url} answered HTTP {exc.status}: {exc.message}",
                                 code=code) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise AdmissionError(f"cannot reach the duplex server at {self.url}: {exc}",
                                 code="backend_unavailable") from None
