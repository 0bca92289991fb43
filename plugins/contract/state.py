"""Model-owned state of one session.

The fields keep the seed contract's names (a vLLM-Omni plugin author looks for them),
but this runtime uses only some of them:

- read and written by the runtime: ``audio_buffer``, ``input_since_commit``,
  ``silence_deadline_monotonic``;
- written by the runtime for the plugin to read (nothing in the runtime reads them):
  ``speech_since_commit`` (the VAD heard speech since the last commit),
  ``deferred_response_create`` (a commit that waits for ``response.create``),
  ``continuation_owner_id`` (the input request a silence unit continues),
  ``continuation_units`` (silence units sent so far), ``last_native_submit_monotonic``
  (when the last real input unit went in);
- never used: ``UNUSED_STATE_FIELDS`` (no context locking, no retained commits, no
  pre-created responses, and silence continuation keeps its own schedule, not a task).
  A plugin whose state sets one of them is told so at load time (``unused_state_fields``).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass

from duplex_agent.plugins.contract.buffers import PcmAppendBuffer

#: Fields of the seed's state that this runtime neither reads nor writes (only ``clear_committed_audio``
#: resets some of them).
UNUSED_STATE_FIELDS = (
    "context_locked",
    "committed_audio_payload",
    "committed_audio_operation_id",
    "committed_audio_reserved_bytes",
    "deferred_precreate_response",
    "pending_silence_task",
    "pending_silence_owner_id",
)


class DuplexModelSessionState(ABC):
    """Model-owned state of one session, held by that session's runner."""

    audio_buffer: PcmAppendBuffer
    input_since_commit: bool
    speech_since_commit: bool
    context_locked: bool
    committed_audio_payload: dict[str, object] | None
    committed_audio_operation_id: str | None
    committed_audio_reserved_bytes: int
    deferred_response_create: bool
    deferred_precreate_response: bool
    continuation_owner_id: str | None
    continuation_units: int
    pending_silence_task: asyncio.Task[bool] | None
    pending_silence_owner_id: str | None
    # Deadline-aligned silence continuation: when the last native unit was
    # submitted and when the next silence unit is due. Real input re-anchors.
    last_native_submit_monotonic: float | None
    silence_deadline_monotonic: float | None

    @abstractmethod
    def retain_committed_audio(
        self,
        payload: dict[str, object],
        *,
        operation_id: str | None,
        reserved_bytes: int = 0,
    ) -> None: ...

    @abstractmethod
    def clear_committed_audio(self) -> int: ...

    @abstractmethod
    def clear_continuation(self) -> None: ...


@dataclass(slots=True)
class DefaultDuplexModelSessionState(DuplexModelSessionState):
    """The flag set every lockstep model shares; a plugin supplies only its buffer."""

    audio_buffer: PcmAppendBuffer
    input_since_commit: bool = False
    speech_since_commit: bool = False
    context_locked: bool = False
    committed_audio_payload: dict[str, object] | None = None
    committed_audio_operation_id: str | None = None
    committed_audio_reserved_bytes: int = 0
    deferred_response_create: bool = False
    deferred_precreate_response: bool = False
    continuation_owner_id: str | None = None
    continuation_units: int = 0
    pending_silence_task: asyncio.Task[bool] | None = None
    pending_silence_owner_id: str | None = None
    last_native_submit_monotonic: float | None = None
    silence_deadline_monotonic: float | None = None

    def retain_committed_audio(
        self,
        payload: dict[str, object],
        *,
        operation_id: str | None,
        reserved_bytes: int = 0,
    ) -> None:
        self.committed_audio_payload = payload
        self.committed_audio_operation_id = operation_id
        self.committed_audio_reserved_bytes += max(0, int(reserved_bytes))

    def clear_committed_audio(self) -> int:
        """Forget retained audio and deferred creates; returns the bytes it held."""
        held = self.committed_audio_reserved_bytes
        self.committed_audio_payload = None
        self.committed_audio_operation_id = None
        self.committed_audio_reserved_bytes = 0
        self.deferred_response_create = False
        self.deferred_precreate_response = False
        return held

    def clear_continuation(self) -> None:
        self.continuation_owner_id = None
        self.continuation_units = 0
        self.pending_silence_task = None
        self.pending_silence_owner_id = None
        self.last_native_submit_monotonic = None
        self.silence_deadline_monotonic = None
