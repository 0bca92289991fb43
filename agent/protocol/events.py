"""The duplex event vocabulary: typed commands in, typed events out.

Names follow vLLM-Omni's duplex realtime endpoint (OpenAI Realtime names plus
duplex extras). The same dataclasses travel through the runner's mailbox, the
websocket endpoint, the remote-server client and the browser's data channel.
Inside the process audio is float32 numpy; ``codec`` turns events into wire JSON
(base64 audio) and back, at the edges only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


class ProtocolError(ValueError):
    """Bad input from a client; becomes an ``error`` event with ``code``."""

    def __init__(self, code: str, message: str, *, event_id: str | None = None, error_type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.event_id = event_id
        self.error_type = error_type
        #: The field of the client's event that is wrong (``item.call_id``), where vLLM-Omni names one.
        self.param = param


@dataclass(slots=True)
class Event:
    type: ClassVar[str] = ""


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
    """Caller audio: float32 mono samples in [-1, 1] at ``sample_rate_hz`` (None: the session's input rate)."""

    type: ClassVar[str] = "input_audio_buffer.append"
    audio: np.ndarray
    sample_rate_hz: int | None = None


@dataclass(slots=True)
class InputAudioBufferCommit(ClientEvent):
    type: ClassVar[str] = "input_audio_buffer.commit"
    #: vLLM-Omni's ``response_create``: False leaves the listen/speak decision to the model (None: the session's).
    response_create: bool | None = None


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
    """How much of a response's audio the caller has actually heard (cumulative).

    Without ``response_id`` (or ``item_id``) it is about the latest response.
    ``truncate``: the response was cut off here; history keeps only what was heard.
    """

    type: ClassVar[str] = "playback.ack"
    played_ms: float
    response_id: str | None = None
    item_id: str | None = None
    committed_ms: float | None = None
    truncate: bool = False


@dataclass(slots=True)
class OutputAudioBufferClear(ClientEvent):
    type: ClassVar[str] = "output_audio_buffer.clear"
    response_id: str | None = None


@dataclass(slots=True)
class BargeIn(ClientEvent):
    """A hard interrupt from the client (its own VAD heard the caller): cancel the active response."""

    type: ClassVar[str] = "barge_in"


@dataclass(slots=True)
class InputTextAppend(ClientEvent):
    type: ClassVar[str] = "input.text.append"
    text: str


#: The error code and message that answer ``input.text.append``: our sessions take audio input only.
TEXT_APPEND_REFUSED = ("native_text_append_unsupported", "this session takes audio input only")


@dataclass(slots=True)
class ConversationItemCreate(ClientEvent):
    type: ClassVar[str] = "conversation.item.create"
    item: dict[str, Any]
    previous_item_id: str | None = None


@dataclass(slots=True)
class ConversationItemRetrieve(ClientEvent):
    type: ClassVar[str] = "conversation.item.retrieve"
    item_id: str


@dataclass(slots=True)
class ConversationItemDelete(ClientEvent):
    type: ClassVar[str] = "conversation.item.delete"
    item_id: str


@dataclass(slots=True)
class TurnSignal(ClientEvent):
    """An external turn-taking signal the vocabulary has no dedicated event for (answered with ``turn.event``)."""

    type: ClassVar[str] = "turn.signal"
    event: str
    payload: dict[str, Any] = field(default_factory=dict)


# Transport-level client events: the websocket endpoint answers them itself.


@dataclass(slots=True)
class SessionHeartbeat(ClientEvent):
    type: ClassVar[str] = "session.heartbeat"


@dataclass(slots=True)
class SessionClose(ClientEvent):
    type: ClassVar[str] = "session.close"
    reason: str = "client_close"


@dataclass(slots=True)
class SessionEventAck(ClientEvent):
    """The client has every server event up to ``server_event_seq``: the replay journal may forget them."""

    type: ClassVar[str] = "session.event_ack"
    server_event_seq: int


@dataclass(slots=True)
class SessionResume(ClientEvent):
    """First event of a new socket: reattach to ``session_id`` and replay what came after the given seq."""

    type: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str
    last_received_server_event_seq: int = 0


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
class SessionHeartbeatAck(ServerEvent):
    type: ClassVar[str] = "session.heartbeat_ack"
    session_id: str


@dataclass(slots=True)
class SessionResumed(ServerEvent):
    type: ClassVar[str] = "session.resumed"
    session_id: str
    session: dict[str, Any]
    attachment_generation: int
    resume_token: str


@dataclass(slots=True)
class SessionReplaced(ServerEvent):
    """Sent to a socket whose session another socket has resumed."""

    type: ClassVar[str] = "session.replaced"
    session_id: str
    attachment_generation: int


@dataclass(slots=True)
class SessionResyncRequired(ServerEvent):
    """Replay cannot be complete (``journal_overflow`` on a live socket, ``journal_gap`` on a resume)."""

    type: ClassVar[str] = "session.resync_required"
    session_id: str
    reason: str


@dataclass(slots=True)
class PlaybackAcknowledged(ServerEvent):
    type: ClassVar[str] = "playback.acknowledged"
    #: None when nothing had been played yet (an idle acknowledgement).
    response_id: str | None
    item_id: str | None
    played_ms: float
    #: The response's playback ledger: generated_ms, sent_ms, played_ms, committed_ms.
    playback: dict[str, float]
    truncate: bool = False


@dataclass(slots=True)
class ConversationItemTruncated(ServerEvent):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    audio_end_ms: float
    content_index: int = 0


@dataclass(slots=True)
class ConversationItemCreated(ServerEvent):
    type: ClassVar[str] = "conversation.item.created"
    item: dict[str, Any]
    previous_item_id: str | None = None


@dataclass(slots=True)
class ConversationItemAdded(ServerEvent):
    """An item entering the conversation (vLLM-Omni sends it before ``conversation.item.created``)."""

    type: ClassVar[str] = "conversation.item.added"
    item: dict[str, Any]
    previous_item_id: str | None = None


@dataclass(slots=True)
class ConversationItemDone(ServerEvent):
    """An item complete in the conversation (after its commit)."""

    type: ClassVar[str] = "conversation.item.done"
    item: dict[str, Any]
    previous_item_id: str | None = None


@dataclass(slots=True)
class ConversationItemDeleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(slots=True)
class ConversationItemRetrieved(ServerEvent):
    type: ClassVar[str] = "conversation.item.retrieved"
    item: dict[str, Any]


@dataclass(slots=True)
class TurnEvent(ServerEvent):
    """A turn signal the session accepted."""

    type: ClassVar[str] = "turn.event"
    event: str
    turn_state: str


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
    item_id: str | None = None


@dataclass(slots=True)
class SpeechStopped(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: float
    item_id: str | None = None


@dataclass(slots=True)
class InputAudioBufferCommitted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None
    #: Conversation items the session holds once this one is in.
    history_len: int = 0


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
    #: A model's function call when this response is that call alone (its ``function_call`` item);
    #: None for a spoken response.
    function_call: dict[str, Any] | None = None


@dataclass(slots=True)
class ResponseOutputItemAdded(ServerEvent):
    """The response's assistant item, opened (vLLM-Omni's order: after ``response.created``)."""

    type: ClassVar[str] = "response.output_item.added"
    response_id: str
    item: dict[str, Any]
    output_index: int = 0


@dataclass(slots=True)
class ResponseOutputItemDone(ServerEvent):
    """The response's assistant item, finished (before ``response.done``)."""

    type: ClassVar[str] = "response.output_item.done"
    response_id: str
    item: dict[str, Any]
    output_index: int = 0


@dataclass(slots=True)
class ResponseContentPartAdded(ServerEvent):
    """The assistant item's audio part, opened."""

    type: ClassVar[str] = "response.content_part.added"
    response_id: str
    item_id: str
    part: dict[str, Any]
    output_index: int = 0
    content_index: int = 0


@dataclass(slots=True)
class ResponseContentPartDone(ServerEvent):
    """The assistant item's audio part with its transcript, finished."""

    type: ClassVar[str] = "response.content_part.done"
    response_id: str
    item_id: str
    part: dict[str, Any]
    output_index: int = 0
    content_index: int = 0


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
    """float32 mono ``audio`` at ``sample_rate``; ``marks`` say which text this audio speaks."""

    type: ClassVar[str] = "response.output_audio.delta"
    response_id: str
    item_id: str
    audio: np.ndarray
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
class ResponseFunctionCallArgumentsDelta(ServerEvent):
    """A piece of a function call's JSON arguments (the call's item opened in ``response.output_item.added``)."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    call_id: str
    delta: str
    output_index: int = 0


@dataclass(slots=True)
class ResponseFunctionCallArgumentsDone(ServerEvent):
    """A function call's arguments, whole: the client (or the worker's tool runner) may run it now."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    call_id: str
    arguments: str
    output_index: int = 0


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
    #: Audio of this response sent to the client (the ledger's ``sent_ms``), not what was heard:
    #: what the caller heard arrives later as ``playback.ack`` (``played_ms``).
    audio_ms: float = 0.0
    #: The model's function call (its ``function_call`` item) when this response is that call alone.
    function_call: dict[str, Any] | None = None


@dataclass(slots=True)
class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    error: dict[str, Any]

    @classmethod
    def of(cls, code: str, message: str, *, event_id: str | None = None, error_type: str = "invalid_request_error",
           param: str | None = None) -> ErrorEvent:
        error: dict[str, Any] = {"type": error_type, "code": code, "message": message, "event_id": event_id}
        if param:
            error["param"] = param
        return cls(error)

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> ErrorEvent:
        return cls.of(exc.code, str(exc), event_id=exc.event_id, error_type=exc.error_type, param=exc.param)

    @property
    def code(self) -> str:
        return str(self.error.get("code"))
