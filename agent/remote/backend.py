"""The remote backend: conversations on a vLLM-Omni duplex server (or our own endpoint).

``start()`` opens a probe session to learn the model's capabilities; each
``open()`` is one websocket to ``/v1/realtime?duplex=1`` (see
``agent.remote_conversation``). Refusals -- HTTP 503, an ``error`` such as
``resource_exhausted``, a close before ``session.created`` -- become
``AdmissionError`` with the code.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from yarl import URL

from duplex_agent.agent.remote.conversation import RemoteConversation, RemoteOptions
from duplex_agent.agent.session.ports import AdmissionError
from duplex_agent.plugins.contract import DuplexCapabilities

_HTTP_CODES = {503: "resource_exhausted", 429: "resource_exhausted", 401: "backend_unauthorized",
               403: "backend_unauthorized"}


class RemoteBackend:
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
        self._http: aiohttp.ClientSession | None = None
        self._capabilities: DuplexCapabilities | None = None
        self._conversations: set[RemoteConversation] = set()
        self._opening = 0
        self._admitting = True

    async def start(self) -> None:
        """Learn the server's capabilities from a probe session (closed at once)."""
        probe = await self.open()
        await probe.close("probe")

    async def close(self) -> None:
        self._admitting = False
        await asyncio.gather(*(c.close("shutdown") for c in list(self._conversations)), return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    @property
    def capabilities(self) -> DuplexCapabilities:
        if self._capabilities is None:
            raise RuntimeError("RemoteBackend.capabilities is known after `await backend.start()`")
        return self._capabilities

    @property
    def active_sessions(self) -> int:
        return len(self._conversations)

    def stop_admitting(self) -> None:
        self._admitting = False

    async def open(self) -> RemoteConversation:
        if not self._admitting:
            raise AdmissionError("this worker is shutting down", code="shutting_down")
        if len(self._conversations) + self._opening >= self.max_sessions:
            raise AdmissionError(f"all {self.max_sessions} remote sessions are in use; try again later")
        self._opening += 1
        try:
            session = dict(self._session_defaults)
            session.setdefault("input_audio_format", "pcm16")
            if self.model:
                session["model"] = self.model
            conversation = await RemoteConversation.open(
                self._connect, session, model=self.model, max_sessions=self.max_sessions, options=self.options,
                on_close=self._conversations.discard,
            )
        finally:
            self._opening -= 1
        self._conversations.add(conversation)
        self._capabilities = conversation.capabilities
        return conversation

    async def _connect(self, *, resume: bool) -> aiohttp.ClientWebSocketResponse:
        """A websocket to the server; AdmissionError with a code when it cannot be had."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        url = self.url.update_query(autostart="0") if resume else self.url  # vLLM-Omni: resume-only socket
        try:
            return await self._http.ws_connect(
                url, headers=self._headers, max_msg_size=16 << 20, heartbeat=15.0,
                timeout=aiohttp.ClientWSTimeout(ws_close=2.0), autoping=True,
            )
        except aiohttp.WSServerHandshakeError as exc:
            code = _HTTP_CODES.get(exc.status, "backend_unavailable")
            raise AdmissionError(f"the duplex server at {self.url} answered HTTP {exc.status}: {exc.message}",
                                 code=code) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise AdmissionError(f"cannot reach the duplex server at {self.url}: {exc}",
                                 code="backend_unavailable") from None
