"""Stand-ins for the runner side: scripted and echoing conversations, a cheap VAD model."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import numpy as np

from duplex_agent.agent.protocol.events import (
    ClientEvent,
    InputAudioBufferAppend,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreated,
    ServerEvent,
)
from duplex_agent.agent.session.ports import AdmissionError, Conversation, DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities

CAPS = DuplexCapabilities(
    plugin_id="fake", input_sample_rate=16000, unit_samples=1280, output_sample_rate=24000, max_sessions=4
)


class FakeConversation(Conversation):
    """Records what is sent; the test pushes server events with ``emit``."""

    # plain attributes here, where the port has read-only properties
    session_id = "fake-session"
    capabilities = CAPS

    def __init__(self, capabilities: DuplexCapabilities = CAPS) -> None:
        self.capabilities = capabilities
        self.session_id = "fake-session"
        self.sent: list[ClientEvent] = []
        self.closed_reason: str | None = None
        self._events: asyncio.Queue[ServerEvent | None] = asyncio.Queue()
        self._all_handled = asyncio.Event()  # the reader is back for more, and none is waiting

    def send(self, event: ClientEvent) -> None:
        self.sent.append(event)

    def emit(self, event: ServerEvent) -> None:
        self._all_handled.clear()
        self._events.put_nowait(event)

    async def events(self) -> AsyncIterator[ServerEvent]:
        while True:
            if self._events.empty():
                self._all_handled.set()
            event = await self._events.get()
            if event is None:
                return
            yield event  # the reader's handling of it runs before this generator resumes

    async def handled(self, timeout: float = 5.0) -> None:
        """Until the reader has handled every emitted event and asks for the next."""
        await asyncio.wait_for(self._all_handled.wait(), timeout)

    async def close(self, reason: str = "client_closed") -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            self._events.put_nowait(None)

    def sent_of(self, kind: type) -> list:
        return [e for e in self.sent if isinstance(e, kind)]


class EchoConversation(FakeConversation):
    """Speaks back every appended chunk as audio of the current response; a cancel starts a new one."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        super().__init__()
        self._response_id: str | None = None
        self._audio_ms = 0.0

    def send(self, event: ClientEvent) -> None:
        super().send(event)
        if isinstance(event, ResponseCancel):
            self._response_id = None
        elif isinstance(event, InputAudioBufferAppend):
            samples = event.audio
            if self._response_id is None:
                self._response_id = f"echo-{next(self._ids)}"
                self._audio_ms = 0.0
                self.emit(ResponseCreated(response_id=self._response_id, item_id=f"item-{self._response_id}"))
            ms = 1000.0 * samples.size / self.capabilities.input_sample_rate
            self.emit(ResponseAudioDelta(
                response_id=self._response_id, item_id=f"item-{self._response_id}",
                audio=samples, sample_rate=self.capabilities.input_sample_rate,
                audio_start_ms=self._audio_ms, audio_ms=ms,
            ))
            self._audio_ms += ms


class HumConversation(FakeConversation):
    """On the caller's first audio, one response ("talk"): ``seconds`` of a 300 Hz hum, in 1 s
    deltas, then its audio done when ``done``."""

    def __init__(self, seconds: int, *, done: bool) -> None:
        super().__init__()
        self.seconds = seconds
        self.done = done
        self.talking = False

    def send(self, event: ClientEvent) -> None:
        super().send(event)
        if isinstance(event, InputAudioBufferAppend) and not self.talking:
            self.talking = True
            self.emit(ResponseCreated(response_id="talk", item_id="i-talk"))
            hum = 0.3 * np.sin(2 * np.pi * 300 * np.arange(24000) / 24000).astype(np.float32)
            for n in range(self.seconds):
                self.emit(ResponseAudioDelta(response_id="talk", item_id="i-talk", audio=hum,
                                             sample_rate=24000, audio_start_ms=1000.0 * n, audio_ms=1000.0))
            if self.done:
                self.emit(ResponseAudioDone(response_id="talk", item_id="i-talk"))


class EchoBackend(DuplexBackend):
    """Opens echo conversations, up to ``max_sessions`` at once."""

    capabilities = CAPS  # a plain attribute, where the port has a read-only property

    def __init__(self, max_sessions: int = 4) -> None:
        self.capabilities = CAPS
        self.max_sessions = max_sessions
        self.conversations: list[EchoConversation] = []

    @property
    def active_sessions(self) -> int:
        return sum(c.closed_reason is None for c in self.conversations)

    async def open(self) -> EchoConversation:
        if self.active_sessions >= self.max_sessions:
            raise AdmissionError("all sessions busy", code="resource_exhausted")
        conversation = EchoConversation()
        self.conversations.append(conversation)
        return conversation


class HumBackend(EchoBackend):
    """Opens ``HumConversation``s (no session limit)."""

    def __init__(self, seconds: int, *, done: bool) -> None:
        super().__init__()
        self.seconds = seconds
        self.done = done

    async def open(self) -> HumConversation:  # type: ignore[override]
        conversation = HumConversation(self.seconds, done=self.done)
        self.conversations.append(conversation)
        return conversation


class EnergyVadModel:
    """Quacks like SileroVadModel: speech probability 1 when a window is loud, else 0."""

    def open_stream(self) -> EnergyVadModel:
        return self

    def probability(self, window: np.ndarray) -> float:
        return 1.0 if float(np.sqrt(np.mean(window**2))) > 0.05 else 0.0

    def reset(self) -> None:
        pass
