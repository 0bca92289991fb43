"""What a transport talks to: a backend that opens conversations.

A conversation takes client events in wire order and yields server events.
The local backend is our session runner with an in-process plugin; the remote
backend is a vLLM-Omni duplex server. Transports see only this interface.

Implementations name the port as their base, so the optional members (their
docstrings begin "Optional:") come with a default that does nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from duplex_agent.agent.models.vad import SharedScores
from duplex_agent.agent.protocol.events import ClientEvent, ServerEvent
from duplex_agent.plugins.contract import DuplexCapabilities

#: Refusals that mean "busy now, ask again later": every slot taken, or the machine saturated.
BUSY_CODES = frozenset({"resource_exhausted", "overloaded"})


class AdmissionError(RuntimeError):
    """The backend cannot take another conversation now (``code`` says why)."""

    def __init__(self, message: str, *, code: str = "resource_exhausted", retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        #: How long the client should wait before it asks again, where the refusal knows.
        self.retry_after_s = retry_after_s


class Conversation(Protocol):
    @property
    def session_id(self) -> str: ...

    @property
    def capabilities(self) -> DuplexCapabilities: ...

    def send(self, event: ClientEvent) -> None:
        """Queue a client event; never blocks; order is kept."""

    def events(self) -> AsyncIterator[ServerEvent]:
        """Server events until the conversation closes."""

    async def close(self, reason: str = "client_closed") -> None: ...

    @property
    def answers_wire_controls(self) -> bool:
        """Optional: ``send`` takes the realtime wire's own client events (``session.heartbeat``,
        ``turn.signal``, ``input.text.append``, and, after ``client_plays_out``, the cancel of a
        finished reply) and answers each after the answers to every event sent before it, as
        vLLM-Omni's command mailbox does. False: the realtime endpoint answers them itself, on
        arrival."""
        return False

    def wire_fence(self) -> tuple[int, int]:
        """Optional: the conversation's (epoch, turn_id), which the realtime wire reports in its
        session object and event metadata; (0, 0) for one that keeps none (a remote server
        reports its own)."""
        return (0, 0)

    def client_plays_out(self) -> None:
        """Optional: the client plays the replies' audio itself (the realtime websocket). A
        ``response.cancel`` of a reply whose generation finished is then ``response_not_active``,
        answered in order as vLLM-Omni does, where a call path's cancel would stop that reply in
        our playout."""
        return None

    def use_caller_vad(self, scores: SharedScores) -> None:
        """Optional: take turn detection from the transport's caller VAD (one VAD pass per call).

        An in-process session reads these scores instead of running the model itself; by
        default the conversation keeps its own turn detection (a remote server does).
        """
        return None


class DuplexBackend(Protocol):
    @property
    def capabilities(self) -> DuplexCapabilities: ...

    @property
    def active_sessions(self) -> int: ...

    @property
    def server_free_sessions(self) -> int | None:
        """Optional: the sessions the backend's servers can still take, when it can tell (a remote one); else None."""
        return None

    async def start(self) -> None:
        """Optional: get ready before the first ``open`` (a remote backend learns the model's capabilities here)."""
        return None

    async def open(self) -> Conversation:
        """A new conversation; raises AdmissionError when full or shutting down."""

    def stop_admitting(self) -> None:
        """Refuse every later ``open`` with ``AdmissionError`` (code ``shutting_down``)."""

    async def close(self) -> None:
        """Close every live conversation (``session.closed`` with reason ``shutdown``)."""
