"""Two ways to drive a conversation in tests: the runner directly, or a real websocket."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import numpy as np

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.runner import DuplexSessionRunner

RATE = 16000


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class Driver:
    """Sends client events as dicts and reads server events as dicts."""

    runner: DuplexSessionRunner | None = None

    async def send(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    async def send_raw(self, text: str) -> None:
        raise NotImplementedError

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def until(self, kind: str, timeout: float = 5.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Read events until one of type ``kind``; returns it and everything read."""
        seen: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            event = await self.recv(max(0.01, end - loop.time()))
            seen.append(event)
            if event["type"] == kind:
                return event, seen

    async def append(self, samples: np.ndarray, chunk_ms: float = 20.0) -> None:
        step = int(RATE * chunk_ms / 1000)
        for i in range(0, len(samples), step):
            await self.send({"type": "input_audio_buffer.append", "audio": pcm16_b64(samples[i:i + step])})


class RunnerDriver(Driver):
    """Drives the runner in-process through the same codec the websocket uses."""

    def __init__(self, runner: DuplexSessionRunner) -> None:
        self.runner = runner
        self.input_format = "pcm16"

    @classmethod
    async def open(cls, backend: LocalBackend) -> RunnerDriver:
        return cls(await backend.open())

    async def send(self, event: dict[str, Any]) -> None:
        assert self.runner is not None
        if event.get("type") == "session.update":
            self.input_format = event.get("session", {}).get("input_audio_format", self.input_format)
        self.runner.send(codec.decode_client_event(json.dumps(event), audio_format=self.input_format))

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        assert self.runner is not None
        event = await asyncio.wait_for(self.runner.next_event(), timeout)
        if event is None:
            raise ConnectionError("conversation closed")
        return codec.encode_event(event)

    async def close(self) -> None:
        assert self.runner is not None
        await self.runner.close()


class WebSocketDriver(Driver):
    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._session = session
        self.ws = ws

    @classmethod
    async def open(cls, url: str) -> WebSocketDriver:
        session = aiohttp.ClientSession()
        ws = await session.ws_connect(url, max_msg_size=16 << 20)
        return cls(session, ws)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def send_raw(self, text: str) -> None:
        await self.ws.send_str(text)

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        message = await self.ws.receive(timeout=timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"websocket closed: {message.type}")
        return json.loads(message.data)

    async def close(self) -> None:
        await self.ws.close()
        await self._session.close()
