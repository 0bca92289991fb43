"""Small stand-ins for a vLLM-Omni duplex server, shaped like its wire contract.

Each test gives ``FakeServer`` a handler for one websocket; ``FakeSession``
numbers events (``server_event_seq``), keeps a journal for resume, and records
what the client sent. Events are vLLM-Omni-shaped (``sample_rate_hz``,
``metadata.audio_duration_ms``, nested ``response.status``), so the tests also
cover the translation to our vocabulary.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

RATE = 24000
OMNI_CAPS = {"implementation_level": "model_native_duplex", "supports_input_append": True,
             "supports_barge_in": True, "supports_session_resume": True, "chunk_period_ms": 1000}


def session_created(*, caps: dict[str, Any], token: str | None = "tok-1",
                    session_id: str = "duplex-1") -> dict[str, Any]:
    data: dict[str, Any] = {"type": "session.created", "attachment_generation": 1, "session": {
        "object": "realtime.session", "id": session_id, "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "sample_rate_hz": 16000},
                  "output": {"format": {"type": "audio/pcm", "rate": RATE}}},
        "capabilities": caps}}
    if token:
        data["resume_token"] = token
    return data


def audio_delta(response_id: str, ms: float = 100.0, level: float = 0.2) -> dict[str, Any]:
    samples = (level * np.sin(np.arange(int(RATE * ms / 1000)) / 5) * 32767).astype("<i2")
    return {"type": "response.output_audio.delta", "response_id": response_id, "output_index": 0, "content_index": 0,
            "delta": base64.b64encode(samples.tobytes()).decode(), "format": "pcm16", "sample_rate_hz": RATE,
            "metadata": {"audio_duration_ms": ms, "epoch": 0}}


def response_done(response_id: str, status: str = "completed", reason: str | None = None) -> dict[str, Any]:
    details = {"type": status, "reason": reason} if reason else None
    return {"type": "response.done", "response_id": response_id,
            "response": {"id": response_id, "object": "realtime.response", "status": status, "status_details": details}}


def function_call_messages(response_id: str, item_id: str, call_id: str, name: str = "get_weather",
                           arguments: str = '{"city":"Paris"}', previous_item_id: str | None = None
                           ) -> list[dict[str, Any]]:
    """A model's call as vLLM-Omni 0.30.0 projects ``function_call.done`` (``realtime_events``): a
    response of its own, its ``response.created`` naming no item (shapes seen from the real server)."""
    item = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "completed", "name": name,
            "call_id": call_id, "arguments": arguments}
    response = {"id": response_id, "object": "realtime.response", "status": "completed",
                "status_details": {"type": "completed", "reason": "completed"}, "output": [item], "metadata": {}}
    scoped = {"response_id": response_id, "item_id": item_id, "output_index": 0, "call_id": call_id}
    return [
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []},
         "response_id": response_id},
        {"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": item},
        {"type": "conversation.item.created", "previous_item_id": previous_item_id, "item": item},
        {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item},
        {"type": "response.function_call_arguments.delta", **scoped, "delta": arguments},
        {"type": "response.function_call_arguments.done", **scoped, "arguments": arguments},
        {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item},
        {"type": "conversation.item.done", "previous_item_id": previous_item_id, "item": item},
        {"type": "response.done", "response": response, "response_id": response_id},
    ]


class FakeSession:
    """Server-side state of one session, which outlives a socket (for resume)."""

    def __init__(self) -> None:
        self.seq = 0
        self.journal: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.ws: web.WebSocketResponse | None = None

    def stamp(self, event: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        stamped = {**event, "server_event_seq": self.seq}
        self.journal.append(stamped)
        return stamped

    async def send(self, event: dict[str, Any]) -> None:
        stamped = self.stamp(event)
        assert self.ws is not None
        await self.ws.send_str(json.dumps(stamped))

    async def receive(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next client message. Heartbeats are answered (as vLLM-Omni does) and counted, and a
        retrieve of an unknown item answered ``item_not_found`` (a resume probe); neither is returned.
        A ``session.close`` is returned and answered ``session.closed``."""
        assert self.ws is not None
        while True:
            message = await self.ws.receive(timeout=timeout)
            if message.type != WSMsgType.TEXT:
                return None
            data = json.loads(message.data)
            if data.get("type") == "session.heartbeat":
                self.heartbeats += 1
                await self.send({"type": "session.heartbeat_ack", "session_id": "duplex-1"})
            elif data.get("type") == "conversation.item.retrieve":
                await self.send({"type": "error", "error": {"type": "invalid_request_error", "code": "item_not_found",
                                                            "message": "Conversation item not found",
                                                            "event_id": data.get("event_id")}})
            else:
                break
        self.received.append(data)
        if data.get("type") == "session.close":  # answered as vLLM-Omni does (else the client waits 2 s for it)
            await self.send({"type": "session.closed", "session_id": "duplex-1", "reason": "client_close"})
        return data

    async def until(self, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        while True:
            data = await self.receive(timeout)
            assert data is not None, f"socket closed while waiting for {kind}"
            if data["type"] == kind:
                return data

    def received_of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["type"] == kind]


Handler = Callable[[web.WebSocketResponse, web.Request], Awaitable[None]]


class FakeServer:
    """An aiohttp server on 127.0.0.1 whose ``/v1/realtime`` runs ``handler`` per socket."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[web.Request] = []
        app = web.Application()
        app.router.add_get("/v1/realtime", self._handle)
        self._server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self._server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)

    async def start(self) -> FakeServer:
        await self._server.start_server()
        return self

    async def close(self) -> None:
        await self._server.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.connections += 1
        self.requests.append(request)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await self.handler(ws, request)
        if not ws.closed:
            await ws.close()
        return ws


def drop_connection(ws: web.WebSocketResponse, request: web.Request) -> None:
    """End the TCP connection without a close frame, as a crashed server or a broken network would."""
    assert request.transport is not None
    request.transport.abort()
