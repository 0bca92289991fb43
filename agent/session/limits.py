"""Per-session limits: what one conversation may hold before it is told to slow down."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionLimits:
    #: Input audio (float32) waiting in the mailbox, in bytes.
    max_pending_input_bytes: int = 4 * 1024 * 1024
    #: Input audio held in the append buffer, in ms at the model rate.
    max_buffered_input_ms: int = 10_000
    #: Committed user turns waiting for the response in front of them.
    max_pending_turns: int = 2
    #: Audio one append may carry.
    max_append_ms: int = 5_000
    #: A session with no client event for this long is closed.
    idle_timeout_s: float = 300.0
    #: Unread events / agent audio (ms) past which the client is told it lags (``session.lagging``)...
    lagging_unread_events: int = 2048
    lagging_unread_audio_ms: float = 10_000.0
    #: ...and cut off (``client_too_slow``) if it then reads nothing for this long.
    client_stall_s: float = 5.0
    #: Never more unread than this, however fast the client reads: past it, cut off.
    max_unread_events: int = 16_384
    max_unread_audio_ms: float = 120_000.0
    #: Conversation items the session keeps (older ones already in the model's context are dropped).
    max_history_items: int = 256

    def max_append_samples(self, sample_rate: int) -> int:
        return sample_rate * self.max_append_ms // 1000

    def max_buffered_bytes(self, sample_rate: int) -> int:
        return sample_rate * self.max_buffered_input_ms // 1000 * 4
