"""``GET /v1/realtime?duplex=1``: the duplex realtime websocket.

Speaks the same vocabulary as vLLM-Omni's duplex endpoint: the first message
must be ``session.update`` (within ``config_timeout_s``), then client events in
any order; every server event carries a ``server_event_seq``. Bad input gets an
``error`` event with a code and the session keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web

from duplex_agent.agent import metrics
from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.session.ports import AdmissionError, Conversation, DuplexBackend

log = logging.getLogger("duplex_agent.realtime")


class RealtimeEndpoint:
    def __init__(self, backend: DuplexBackend, *, config_timeout_s: float = 10.0, max_frame_bytes: int = 1 << 20) -> None:
        self.backend = backend
        self.config_timeout_s = config_timeout_s
        self.max_frame_bytes = max_frame_bytes

    def register(self, app: web.Application) -> None:
        app.router.add_get("/v1/realtime", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("duplex") not in ("1", "true"):
            raise web.HTTPBadRequest(text=json.dumps({"error": "this endpoint serves duplex sessions: add ?duplex=1"}),
                                     content_type="application/json")
        ws = web.WebSocketResponse(max_msg_size=4 * self.max_frame_bytes, heartbeat=30.0)
        await ws.prepare(request)
        link = _Link(ws)
        first = await self._first_event(ws, link)
        if first is None:
            await ws.close()
            return ws
        try:
            conversation = await self.backend.open()
        except AdmissionError as exc:
            await link.send(p.ErrorEvent.of(exc.code, str(exc), event_id=first.event_id, error_type="server_error"))
            await ws.close()
            return ws
        pump = asyncio.create_task(self._pump(conversation, link, ws))
        try:
            conversation.send(first)
            await self._receive(ws, link, conversation)
        finally:
            await conversation.close("client_closed")
            await asyncio.gather(pump, return_exceptions=True)
            await ws.close()
        return ws

    async def _first_event(self, ws: web.WebSocketResponse, link: _Link) -> p.SessionUpdate | None:
        try:
            message = await ws.receive(timeout=self.config_timeout_s)
        except TimeoutError:
            await link.send(p.ErrorEvent.of("config_timeout", f"no session.update within {self.config_timeout_s:g} s"))
            return None
        if message.type != WSMsgType.TEXT:
            return None
        try:
            event = self._decode(message.data, link)
        except p.ProtocolError as exc:
            await link.send(p.ErrorEvent.from_exception(exc))
            return None
        if not isinstance(event, p.SessionUpdate):
            await link.send(p.ErrorEvent.of("session_update_required", "the first event must be session.update",
                                            event_id=event.event_id))
            return None
        return event

    async def _receive(self, ws: web.WebSocketResponse, link: _Link, conversation: Conversation) -> None:
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                try:
                    conversation.send(self._decode(message.data, link))
                except p.ProtocolError as exc:
                    await link.send(p.ErrorEvent.from_exception(exc))
            elif message.type == WSMsgType.BINARY:
                await link.send(p.ErrorEvent.of("binary_not_supported", "send events as JSON text frames"))
            elif message.type == WSMsgType.ERROR:
                log.info("websocket error: %s", ws.exception())
                return

    def _decode(self, text: str, link: _Link) -> p.ClientEvent:
        if len(text) > self.max_frame_bytes:
            raise p.ProtocolError("frame_too_large", f"a frame may carry at most {self.max_frame_bytes} bytes")
        return codec.decode_client_event(text, audio_format=link.input_format)

    async def _pump(self, conversation: Conversation, link: _Link, ws: web.WebSocketResponse) -> None:
        async for event in conversation.events():
            await link.send(event)
        # The session has ended (its session.closed is out): end the socket too, so a client
        # that keeps it open cannot hold a draining server.
        await ws.close(message=b"session closed")


class _Link:
    """Sends server events on one websocket, numbering them; knows the session's wire audio formats."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._seq = 0
        self.input_format = "pcm16"
        self.output_format = "pcm16"

    async def send(self, event: p.ServerEvent) -> None:
        if isinstance(event, p.ErrorEvent):
            metrics.ERRORS.labels(event.code).inc()
        if self._ws.closed:
            return
        if isinstance(event, p.SessionCreated | p.SessionUpdated):
            self.input_format = str(event.session.get("input_audio_format", self.input_format))
            self.output_format = str(event.session.get("output_audio_format", self.output_format))
        self._seq += 1
        data: dict[str, Any] = codec.encode_event(event, audio_format=self.output_format)
        data["server_event_seq"] = self._seq
        try:
            await self._ws.send_str(json.dumps(data, separators=(",", ":")))
        except ConnectionError:
            pass
