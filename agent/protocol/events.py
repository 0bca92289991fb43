"""The duplex event vocabulary: typed commands in, typed events out.

Names follow vLLM-Omni's duplex realtime endpoint (OpenAI Realtime names plus
duplex extras). The same dataclasses travel through the runner's mailbox, the
websocket endpoint, the remote-server client and the browser's data channel;
their JSON is derived from the fields.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar


class ProtocolError(ValueError):
    """Bad input from a client; becomes an ``error`` event with ``code``."""

    def __init__(self, code: str, message: str, *, event_id: str | None = None, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.event_id = event_id
        self.error_type = error_type


@dataclass(slots=True)
class Event:
    type: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["type"] = self.type
        return data


# ---- client -> server ----


@dataclass(slots=True)
class ClientEvent(Event):
    event_id: str | None = field(default=None, kw_only=True)


@dataclass(slots=True)
class SessionUpdate(ClientEvent):
    type: ClassVar[str] = "session.update"
    session: dict[str, Any]


@dataclass(slots=True)
class InputAudioBufferAppend(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.append"
    audio: str


@dataclass(slots=True)
class InputAudioBufferCommit(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.commit"


@dataclass(slots=True)
class InputAudioBufferClear(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(slots=True)
class ResponseCreate(ClientEvent):
    type: ClassVar[str] = "response.create"
    response: dict[str, Any] | None = None


@dataclass(slots=True)
class ResponseCancel(ClientEvent):
    type: ClassVar[str] = "response.cancel"
    response_id: str | None = None
    reason: str = "client_cancelled"


@dataclass(slots=True)
class ConversationItemTruncate(ClientEvent):
    type: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    audio_end_ms: float
    content_index: int = 0


@dataclass(slots=True)
class PlaybackAck(ClientEvent):
    """How much of a response's audio the caller has actually heard."""

    type: ClassVar[str] = "playback.ack"
    response_id: str
    played_ms: float


@dataclass(slots=True)
class OutputAudioBufferClear(ClientEvent):
    type: ClassVar[str] = "output_audio_buffer.clear"


@dataclass(slots=True)
class InputDtmf(ClientEvent):
    """A telephone keypad digit from the caller."""

    type: ClassVar[str] = "input_dtmf"
    digit: str


# ---- server -> client ----


@dataclass(slots=True)
class ServerEvent(Event):
    pass


@dataclass(slots=True)
class SessionCreated(ServerEvent):
    type: ClassVar[str] = "session.created"
    session: dict[str, Any]


@dataclass(slots=True)
class SessionUpdated(ServerEvent):
    type: ClassVar[str] = "session.updated"
    session: dict[str, Any]


@dataclass(slots=True)
class SessionClosed(ServerEvent):
    type: ClassVar[str] = "session.closed"
    reason: str


@dataclass(slots=True)
class SessionLagging(ServerEvent):
    """The model cannot keep up with real time for this session."""

    type: ClassVar[str] = "session.lagging"
    stage: str
    lag_ms: float


@dataclass(slots=True)
class SpeechStarted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: float
    item_id: str


@dataclass(slots=True)
class SpeechStopped(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: float
    item_id: str


@dataclass(slots=True)
class InputAudioBufferCommitted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


@dataclass(slots=True)
class InputAudioBufferCleared(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(slots=True)
class InputTranscriptionCompleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    transcript: str


@dataclass(slots=True)
class DtmfReceived(ServerEvent):
    type: ClassVar[str] = "input_dtmf.received"
    digit: str


@dataclass(slots=True)
class ResponseCreated(ServerEvent):
    type: ClassVar[str] = "response.created"
    response_id: str
    item_id: str


@dataclass(slots=True)
class ResponseSpeak(ServerEvent):
    type: ClassVar[str] = "response.speak"
    response_id: str


@dataclass(slots=True)
class ResponseListen(ServerEvent):
    type: ClassVar[str] = "response.listen"
    response_id: str | None = None
    reason: str = ""


@dataclass(slots=True)
class ResponseAudioDelta(ServerEvent):
    """Base64 audio at ``sample_rate``; ``marks`` say which text this audio speaks."""

    type: ClassVar[str] = "response.output_audio.delta"
    response_id: str
    item_id: str
    delta: str
    sample_rate: int
    audio_start_ms: float
    audio_ms: float
    #: [{"text": str, "start_ms": float, "end_ms": float}] relative to the response's audio.
    marks: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class ResponseAudioDone(ServerEvent):
    type: ClassVar[str] = "response.output_audio.done"
    response_id: str
    item_id: str


@dataclass(slots=True)
class ResponseTranscriptDelta(ServerEvent):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    response_id: str
    item_id: str
    delta: str


@dataclass(slots=True)
class ResponseTranscriptDone(ServerEvent):
    type: ClassVar[str] = "response.output_audio_transcript.done"
    response_id: str
    item_id: str
    transcript: str


@dataclass(slots=True)
class OutputAudioBufferCleared(ServerEvent):
    type: ClassVar[str] = "output_audio_buffer.cleared"
    response_id: str | None = None


@dataclass(slots=True)
class ResponseDone(ServerEvent):
    """``status``: completed | cancelled | failed; ``reason`` says why when not completed."""

    type: ClassVar[str] = "response.done"
    response_id: str
    status: str
    reason: str = ""
    #: Audio the caller heard of this response, as far as the runner knows.
    audio_ms: float = 0.0


@dataclass(slots=True)
class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    error: dict[str, Any]

    @classmethod
    def of(cls, code: str, message: str, *, event_id: str | None = None, error_type: str = "invalid_request_error") -> ErrorEvent:
        return cls({"type": error_type, "code": code, "message": message, "event_id": event_id})

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> ErrorEvent:
        return cls.of(exc.code, str(exc), event_id=exc.event_id, error_type=exc.error_type)

    @property
    def code(self) -> str:
        return str(self.error.get("code"))


# ---- decoding ----


def _registry(base: type[Event]) -> dict[str, type[Event]]:
    found: dict[str, type[Event]] = {}
    pending = list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # dataclass(slots=True) replaces each class; the replaced one lingers in
        # __subclasses__() until garbage-collected and must not be registered.
        if cls.type and "__slots__" in vars(cls):
            found[cls.type] = cls
    return found


CLIENT_EVENTS: dict[str, type[Event]] = _registry(ClientEvent)
SERVER_EVENTS: dict[str, type[Event]] = _registry(ServerEvent)


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or annotation)


def decode_event(data: Any, registry: dict[str, type[Event]]) -> Event:
    """Build the typed event a JSON object describes, or raise ProtocolError."""
    if not isinstance(data, dict):
        raise ProtocolError("invalid_event", "an event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_field", "event has no string 'type'", event_id=event_id)
    cls = registry.get(kind)
    if cls is None:
        raise ProtocolError("unknown_event_type", f"unknown event type {kind!r}", event_id=event_id)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError("missing_field", f"{kind}: missing field {f.name!r}", event_id=event_id)
            continue
        value = data[f.name]
        if not _matches(value, hints[f.name]):
            raise ProtocolError("invalid_field", f"{kind}: field {f.name!r} has the wrong type", event_id=event_id)
        kwargs[f.name] = float(value) if hints[f.name] is float else value
    return cls(**kwargs)


def decode_client_event(text: str | bytes) -> ClientEvent:
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("invalid_json", f"message is not JSON: {exc}") from None
    event = decode_event(data, CLIENT_EVENTS)
    assert isinstance(event, ClientEvent)
    return event


def decode_server_event(data: Any) -> ServerEvent:
    event = decode_event(data, SERVER_EVENTS)
    assert isinstance(event, ServerEvent)
    return event
