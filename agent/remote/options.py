"""The remote client's timeouts and limits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    #: The websocket handshake (TCP, TLS, HTTP upgrade).
    connect_timeout_s: float = 5.0
    open_timeout_s: float = 10.0
    #: Input audio the outgoing queue may hold while the server is slow; older audio is dropped.
    max_queued_input_ms: float = 2000.0
    #: No server event for this long while a response plays: the response is cancelled here.
    stall_timeout_s: float = 3.0
    #: A socket quiet for this long gets a websocket ping (see ``liveness``).
    probe_after_s: float = 0.25
    #: Nothing from the server for this long, not even a pong: its host is given up (a frozen VM, a
    #: partition, a power cut send no reset). The gap above ``probe_after_s`` is the pause forgiven.
    unresponsive_after_s: float = 1.5
    #: How long to keep trying to resume a dropped session (vLLM-Omni keeps one for 30 s).
    resume_window_s: float = 30.0
    #: First resume delay; doubles per try up to 2 s.
    resume_backoff_s: float = 0.2
    #: ``session.heartbeat`` period, which keeps a vLLM-Omni session's lease (its client's default).
    heartbeat_interval_s: float = 30.0
    #: How long ``close`` waits for the server's ``session.closed`` after the queued messages.
    close_timeout_s: float = 2.0
    #: Longest input append (a longer model unit goes in equal slices).
    max_append_ms: float = 100.0
    #: Acknowledge received events every this many, so a resuming server can trim its journal.
    event_ack_every: int = 50
    #: A resume whose connect is refused or times out gives up at once: the host is gone, and a
    #: pool of backends moves the call to another instead of waiting out ``resume_window_s``.
    resume_gives_up_unreachable: bool = False
    #: A receipt (``session.heartbeat``) after this much input audio, so at most this much is of
    #: unknown fate when the socket drops (see ``outbox``).
    receipt_every_ms: float = 200.0
    #: Whether the model calls tools, and answers their outputs by itself, where the server's own
    #: word is not enough (None: as ``session.created`` says; see ``session.tool_capabilities``).
    tools: bool | None = None
    replies_to_tool_output: bool | None = None

