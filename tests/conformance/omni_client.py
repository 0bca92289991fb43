"""A client written from vLLM-Omni's documented duplex wire (docs/serving/realtime_duplex_api.md,
vllm_omni/engine/duplex/realtime_commands.py), not from our code.

It checks every server event it reads against the shapes vLLM-Omni's clients rely on
(``SHAPES``), that each carries a server ``event_id`` and a rising ``server_event_seq``,
and it remembers the last seq and resume token so a test can drop and resume.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import numpy as np

#: Server event type -> (field, type) pairs every such event must carry (a dotted field is nested).
SHAPES: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "session.created": (("session.id", str), ("session.object", str), ("session.audio.input.format.type", str),
                        ("session.audio.input.format.rate", int), ("session.capabilities.implementation_level", str),
                        ("session.capabilities.supports_session_resume", bool),
                        ("session.capabilities.chunk_period_ms", int), ("attachment_generation", int)),
    "session.updated": (("session.id", str), ("session.audio.input.format.type", str)),
    "session.heartbeat_ack": (("session_id", str),),
    "session.closed": (("session_id", str), ("reason", str)),
    "session.resumed": (("session_id", str), ("resume_token", str), ("attachment_generation", int),
                        ("session.id", str)),
    "session.resync_required": (("session_id", str), ("reason", str)),
    "response.created": (("response_id", str), ("response.id", str), ("response.object", str),
                         ("response.status", str)),
    "response.done": (("response_id", str), ("response.id", str), ("response.status", str),
                      ("response.output", list)),
    "response.listen": (("response.status", str),),
    "response.output_audio.delta": (("response_id", str), ("item_id", str), ("output_index", int),
                                    ("content_index", int), ("delta", str), ("format", str),
                                    ("sample_rate_hz", int), ("metadata.audio_duration_ms", int),
                                    ("metadata.audio_text_marks", list)),
    "response.output_audio.done": (("response_id", str), ("item_id", str), ("output_index", int),
                                   ("content_index", int)),
    "response.output_audio_transcript.delta": (("response_id", str), ("item_id", str), ("output_index", int),
                                               ("content_index", int), ("delta", str)),
    "response.output_audio_transcript.done": (("response_id", str), ("transcript", str)),
    "input_audio_buffer.speech_started": (("audio_start_ms", (int, float)),),
    "input_audio_buffer.speech_stopped": (("audio_end_ms", (int, float)),),
    "input_audio_buffer.committed": (("item_id", str),),
    "playback.acknowledged": (("event.played_ms", (int, float)), ("event.playback", dict)),
    "conversation.item.truncated": (("item_id", str), ("audio_end_ms", (int, float))),
    "conversation.item.created": (("item.id", str),),
    "conversation.item.deleted": (("item_id", str),),
    "conversation.item.retrieved": (("item.id", str),),
    "output_audio_buffer.cleared": (),
    "response.output_item.added": (("response_id", str), ("output_index", int), ("item.id", str), ("item.type", str)),
    "response.output_item.done": (("response_id", str), ("output_index", int), ("item.id", str), ("item.type", str)),
    "response.function_call_arguments.delta": (("response_id", str), ("item_id", str), ("output_index", int),
                                               ("call_id", str), ("delta", str)),
    "response.function_call_arguments.done": (("response_id", str), ("item_id", str), ("output_index", int),
                                              ("call_id", str), ("arguments", str)),
    "conversation.item.added": (("item.id", str),),
    "conversation.item.done": (("item.id", str),),
    "error": (("error.type", str), ("error.code", str), ("error.message", str)),
}
ERROR_TYPES = ("invalid_request_error", "server_error", "rate_limit_error")


def field_of(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise AssertionError(f"{data.get('type')}: missing {dotted}: {json.dumps(data)[:300]}")
        value = value[part]
    return value


def check_shape(data: dict[str, Any]) -> None:
    kind = data.get("type")
    assert isinstance(kind, str), data
    for name, expected in SHAPES.get(kind, ()):
        value = field_of(data, name)
        assert isinstance(value, expected) and not (expected is int and isinstance(value, bool)), \
            f"{kind}.{name} = {value!r}"
    if kind == "error":
        assert data["error"]["type"] in ERROR_TYPES and "event_id" in data["error"], data


def pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class OmniClient:
    """One socket to ``/v1/realtime?duplex=1``; the session it learns outlives the socket (for resume)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = aiohttp.ClientSession()
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq = 0
        self.seen: list[dict[str, Any]] = []

    async def connect(self, query: str = "") -> OmniClient:
        self.ws = await self.http.ws_connect(self.url + query, max_msg_size=64 << 20)
        return self

    async def open(self, session: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        """session.update as the first message -> the session.created it gets."""
        await self.connect()
        await self.send({"type": "session.update", "session": session or {}, **fields})
        created, _ = await self.until("session.created")
        return created

    async def send(self, event: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps(event))

    async def send_raw(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send_str(text)

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.ws is not None
        message = await self.ws.receive(timeout=timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"socket closed ({message.type.name}, code {self.ws.close_code})")
        data = json.loads(message.data)
        check_shape(data)
        seq = data.get("server_event_seq")
        if isinstance(seq, int):
            assert seq > self.last_seq, f"server_event_seq went from {self.last_seq} to {seq}"
            assert isinstance(data.get("event_id"), str) and data["event_id"], data
            self.last_seq = seq
        if data["type"] in ("session.created", "session.resumed"):
            self.session_id = data.get("session_id") or data["session"]["id"]
            self.resume_token = data.get("resume_token", self.resume_token)
        self.seen.append(data)
        return data

    async def until(self, kind: str, timeout: float = 10.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        seen: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            event = await self.recv(max(0.01, end - loop.time()))
            seen.append(event)
            if event["type"] == kind:
                return event, seen

    async def append(self, samples: np.ndarray, chunk_ms: float = 20.0, rate: int = 16000, **extra: Any) -> None:
        step = int(rate * chunk_ms / 1000)
        for i in range(0, len(samples), step):
            await self.send({"type": "input_audio_buffer.append", "audio": pcm16(samples[i:i + step]), **extra})

    def drop(self) -> None:
        """End the TCP connection with no close frame, as a network blip would."""
        assert self.ws is not None
        transport = self.ws._conn.transport if self.ws._conn is not None else None  # type: ignore[attr-defined]
        assert transport is not None, "no transport to drop"
        transport.abort()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.http.close()
