"""The model-plugin contract for full-duplex models.

Follows vLLM-Omni's duplex plugin contract member by member (names and meaning),
so that an author of a vLLM-Omni plugin finds the same hooks here. One
``DuplexModelPlugin`` subclass describes one model: its engine policy (how input
becomes stage requests, what stage outputs mean) and its session policy
(capabilities, runtime configuration, per-session state, event projection).
The session runner in ``agent/`` drives it; a plugin never sees a transport.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from plugins.engine import DuplexEngine


# ---- types the upstream contract imports from its engine package ----


@dataclass(frozen=True, slots=True)
class DuplexCapabilities:
    """What a model can do; sent to clients in ``session.created``/``updated``.

    Clients branch on these fields, never on the model's name.
    """

    plugin_id: str
    input_sample_rate: int
    #: Samples in one model unit (the slice the model consumes at once).
    unit_samples: int
    output_sample_rate: int
    max_sessions: int
    #: "continuous": every unit of caller audio goes to the model (Moshi-like);
    #: "turn": audio is gated by voice activity into user turns.
    input_mode: Literal["continuous", "turn"] = "turn"
    input_formats: tuple[str, ...] = ("pcm16", "pcm_f32le")
    output_format: str = "pcm16"
    supports_barge_in: bool = True
    supports_playback_ack: bool = True
    supports_truncation: bool = True
    supports_resume: bool = False
    #: The model decides itself what overlapping speech means (backchannels).
    handles_overlap: bool = False

    @property
    def unit_ms(self) -> float:
        return 1000.0 * self.unit_samples / self.input_sample_rate

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["input_formats"] = list(self.input_formats)
        data["unit_ms"] = self.unit_ms
        return data


@dataclass(slots=True)
class DuplexSessionConfig:
    """The client-visible session configuration (``session.update``)."""

    instructions: str = ""
    voice: str | None = None
    modalities: tuple[str, ...] = ("audio", "text")
    input_audio_format: str = "pcm16"
    input_sample_rate: int = 16000
    output_audio_format: str = "pcm16"
    #: ``None`` means manual commits; else server VAD settings.
    turn_detection: dict[str, object] | None = None
    #: What caller speech over agent speech means: "barge_in" or "listen".
    overlap_policy: str = "barge_in"
    extra_body: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DuplexFence:
    """The (epoch, turn) a piece of work was started under.

    The epoch advances on every cancel, clear and barge-in; work whose fence no
    longer matches the session's is stale and its results are dropped.
    """

    epoch: int
    turn_id: int

    def admits(self, current: DuplexFence) -> bool:
        return self.epoch == current.epoch


@dataclass(frozen=True, slots=True)
class DuplexAppendPlan:
    """One submission to one engine stage.

    ``resumable`` keeps the stage request open for more input (streaming input);
    a plan with ``final=True`` closes it.
    """

    request_id: str
    stage_id: int
    fence: DuplexFence
    payload: object
    final: bool
    resumable: bool = True
    sampling_params: object = None


@dataclass(frozen=True, slots=True)
class DuplexOutputDecision:
    """What a model's output means for the conversation.

    ``speak``: the model takes (or keeps) the floor; ``listen``: it yields and
    keeps listening; ``finish`` closes the response after this output.
    """

    action: Literal["speak", "listen", "finish"]
    reason: str = ""


# ---- errors and validation helpers ----


class DuplexRuntimeConfigError(ValueError):
    """A plugin refused a client's runtime configuration; ``code`` reaches the client."""

    def __init__(self, message: str, *, code: str = "invalid_duplex_runtime_config") -> None:
        super().__init__(message)
        self.code = code


class PrivateRuntimeKeyError(DuplexRuntimeConfigError):
    """A client tried to set a key the server owns (ours; for ``reject_private_runtime_keys``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="private_runtime_key")


def reject_private_runtime_keys(
    extra_body: object,
    private_runtime_config_keys: frozenset[str],
    *,
    message: str,
    error_cls: type[DuplexRuntimeConfigError] = DuplexRuntimeConfigError,
) -> None:
    """Refuse client ``extra_body`` keys the server owns; names them in the message."""
    if not isinstance(extra_body, dict):
        return
    offending = sorted(private_runtime_config_keys & extra_body.keys())
    if offending:
        raise error_cls(message + ", ".join(offending))


def reject_changed_runtime_value(
    new_value: object,
    current_value: object,
    *,
    message: str,
    code: str,
    error_cls: type[DuplexRuntimeConfigError] = DuplexRuntimeConfigError,
) -> None:
    """Refuse a change to a value that is fixed once the session started."""
    if new_value != current_value:
        raise error_cls(message, code=code)


# ---- input packetizing ----


class PcmAppendReservation(ABC):
    """Audio taken out of an append buffer, pending the engine's acceptance.

    ``commit`` makes the removal final; ``rollback`` puts the bytes back in
    front of the buffer. Reservations settle in the order they were made.
    """

    operation_id: str
    payload: dict[str, object] | None

    @property
    @abstractmethod
    def active(self) -> bool: ...

    @property
    @abstractmethod
    def byte_count(self) -> int: ...

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...


class PcmAppendBuffer(ABC):
    """Turns arbitrarily sized appends into whole model units."""

    @property
    @abstractmethod
    def pending_byte_count(self) -> int: ...

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def clear_force_listen(self) -> None: ...

    @abstractmethod
    def has_pending(self) -> bool: ...

    @abstractmethod
    def has_reserved(self) -> bool: ...

    @abstractmethod
    def prepare_append(
        self,
        payload: dict[str, object],
        *,
        operation_id: str,
        chunk_period_ms: int,
        allow_emit: bool,
    ) -> PcmAppendReservation | None: ...

    @abstractmethod
    def prepare_commit(
        self,
        *,
        operation_id: str,
        chunk_period_ms: int,
    ) -> PcmAppendReservation: ...

    @abstractmethod
    def flush(self, *, chunk_period_ms: int) -> dict[str, object] | None: ...


# ---- per-session model state ----


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


# ---- output projection ----


class DuplexDataPlane(ABC):
    """Turns one model's raw stage outputs into duplex event dicts."""

    @abstractmethod
    def begin_request(self, request_id: str) -> None: ...

    @abstractmethod
    def is_terminal(self, request_id: str | None) -> bool: ...

    @abstractmethod
    def mark_terminal(self, request_id: str) -> None: ...

    @abstractmethod
    def close_stream(self, request_id: str) -> None: ...

    @abstractmethod
    def close_session(self, session_id: str, *, active_request_id: str | None = None) -> None: ...

    @abstractmethod
    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]: ...


#: (audio, sample_rate, response_format, speed) -> base64 audio, or None to drop.
EncodeAudio = Callable[[object, int, str, "float | None"], "str | None"]


@dataclass(frozen=True, slots=True)
class PartialStageForward:
    """One update the runner should submit to the next stage before a stage ends.

    ``output`` is the plugin's payload, opaque to the runner. ``close_only`` is a
    final update carrying no new content. ``queue_close_after`` means this update
    still has content but the upstream stage has finished: submit it resumable and
    let ``partial_stage_followup`` send the close.
    """

    output: object
    is_final_update: bool
    close_only: bool = False
    queue_close_after: bool = False


# ---- the plugin ----


class DuplexModelPlugin(ABC):
    """Everything the runtime needs to know about one full-duplex model."""

    projects_intermediate_outputs: bool = False
    plugin_id: str = ""
    private_runtime_config_keys: frozenset[str] = frozenset()
    #: Samples per silence unit the runner appends to keep a model turn going.
    silence_continuation_samples: int = 16000
    data_plane: DuplexDataPlane

    def __init__(self, encode_audio: EncodeAudio) -> None:
        # Concrete plugins hand the encoder to their data plane.
        del encode_audio

    # ---- engine policy ----

    @abstractmethod
    def configure_sampling_params(
        self,
        *,
        runtime_config: dict[str, object],
        defaults: tuple[object, ...],
    ) -> tuple[object, ...]: ...

    def prepare_prompt_config(
        self, config: dict[str, object], *, state: DuplexModelSessionState, payload: dict[str, object]
    ) -> dict[str, object]:
        """Add model-owned context before an append is planned (on the session loop)."""
        return config

    async def prepare_append_plan(self, **kwargs: Any) -> DuplexAppendPlan:
        """Build a plan; a plugin may offload expensive preparation here."""
        return self.plan_append(**kwargs)

    @abstractmethod
    def plan_append(
        self,
        *,
        request_id: str,
        fence: DuplexFence,
        session_config: dict[str, object],
        runtime_config: dict[str, object],
        seq: int,
        turn_seq: int,
        payload: object,
        final: bool,
        sampling_params: object,
    ) -> DuplexAppendPlan: ...

    @abstractmethod
    def decide_output(
        self,
        *,
        stage_id: int,
        final_stage_id: int,
        segment_finished: bool,
        segment_token_ids: tuple[int, ...],
        segment_output_metadata: dict[str, object],
        output: object,
    ) -> DuplexOutputDecision | None: ...

    def project_intermediate_output(self, *, stage_id: int, output: object, context: object) -> bool:
        """True projects this non-final stage output to the client as well.

        Unlike ``decide_output`` this does not stop the output from flowing on
        to the next stage. Off by default.
        """
        del stage_id, output, context
        return False

    def user_transcript(self, *, stage_id: int, output: object, prompt: object, finished: bool) -> str | None:
        """The caller's words recognised in this output, or None (the default)."""
        del stage_id, output, prompt, finished
        return None

    def plan_partial_stage_output(
        self,
        orchestrator: object,
        stage_id: int,
        replica_id: int,
        output: object,
        req_state: object,
    ) -> PartialStageForward | None:
        """An update to submit downstream before this stage finishes, or None.

        Lets a model start speaking after its first sentence; by default a stage's
        output goes downstream only when the stage finishes.
        """
        del orchestrator, stage_id, replica_id, output, req_state
        return None

    def partial_stage_followup(self, plan: PartialStageForward, req_state: object) -> PartialStageForward | None:
        """An optional second update after ``plan`` was submitted (e.g. the close)."""
        del plan, req_state
        return None

    def commit_model_context(self, *, session_id: str | None, assistant_text: str) -> None:
        """Keep the assistant's words in the model's own context at a turn boundary.

        The runner passes only what the caller heard. No-op by default.
        """
        del session_id, assistant_text

    def release_concurrent_turn_requests(
        self,
        *,
        stage_id: int,
        segment_finished: bool,
        output: object,
        context: object,
    ) -> bool:
        """True when the next user turn may start while earlier speech still drains."""
        del stage_id, segment_finished, output, context
        return False

    def draining_stage_ids(self, *, stage_count: int) -> frozenset[int]:
        """Output stages that may keep running after the next user turn starts."""
        del stage_count
        return frozenset()

    # ---- session policy ----

    @abstractmethod
    def create_session_state(self) -> DuplexModelSessionState: ...

    @abstractmethod
    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities: ...

    @abstractmethod
    def validate_client_extra_body(self, extra_body: object) -> None: ...

    @abstractmethod
    async def prepare_runtime_config(
        self, config: DuplexSessionConfig, *, model_config: object | None
    ) -> dict[str, object]: ...

    @abstractmethod
    def runtime_config_for_update(
        self,
        config: DuplexSessionConfig,
        current: Mapping[str, object],
    ) -> dict[str, object]: ...

    @abstractmethod
    def data_plane_context(
        self,
        *,
        epoch: int,
        turn_id: int,
        active_response_turn_id: int | None,
        active_response_id: str | None,
        auto_responds: bool,
        response_format: str,
        speed: float | None,
        modalities: tuple[str, ...],
    ) -> object: ...

    def runtime_config_for_function_output(
        self,
        config: DuplexSessionConfig,
        current: Mapping[str, object],
        item: Mapping[str, object],
    ) -> dict[str, object] | None:
        """A runtime-config patch for a function-call output item; none by default."""
        del config, current, item
        return None

    def runtime_config_after_model_output(
        self,
        current: Mapping[str, object],
        output_metadata: Mapping[str, object],
    ) -> dict[str, object] | None:
        """A runtime-config patch after the model produced output; none by default."""
        del current, output_metadata
        return None

    # ---- ours, beyond the upstream contract ----

    def build_local_engine(self) -> DuplexEngine:
        """The engine that runs this model's stages in this process.

        Plugins served only by an external engine keep the default.
        """
        raise NotImplementedError(f"plugin {self.plugin_id!r} has no in-process engine")


def load_duplex_plugin(path: str, encode_audio: EncodeAudio) -> DuplexModelPlugin:
    """Import ``package.module.Class``, build it, and check it is a usable plugin."""
    module_name, dot, attribute = path.rpartition(".")
    if not dot:
        raise ValueError(f"Invalid duplex plugin path: {path!r}")
    plugin_type = getattr(import_module(module_name), attribute)
    plugin = plugin_type(encode_audio)
    if not isinstance(plugin, DuplexModelPlugin):
        raise TypeError(f"{path!r} is not a DuplexModelPlugin")
    if not plugin.plugin_id:
        raise TypeError("Duplex plugin must declare plugin_id")
    if not isinstance(getattr(plugin, "data_plane", None), DuplexDataPlane):
        raise TypeError("Duplex plugin must declare a DuplexDataPlane as data_plane")
    return plugin


def validate_duplex_plugin_sampling(plugin: DuplexModelPlugin, *, sampling_defaults: tuple[object, ...]) -> None:
    """Fail at start when a plugin cannot give one sampling parameter per stage."""
    configured = plugin.configure_sampling_params(runtime_config={}, defaults=sampling_defaults)
    if not isinstance(configured, tuple):
        raise TypeError("Duplex plugin must return sampling parameters as a tuple")
    if len(configured) != len(sampling_defaults):
        raise ValueError("Duplex plugin must return one sampling parameter per stage")
    for stage_id, (value, default) in enumerate(zip(configured, sampling_defaults, strict=True)):
        if default is not None and not isinstance(value, type(default)):
            raise TypeError(
                f"Duplex plugin sampling parameter type mismatch for stage {stage_id}: "
                f"expected {type(default).__name__}, got {type(value).__name__}"
            )


def payload_turn_id(payload: object) -> int | None:
    """The turn id a payload carries (``duplex_turn_id`` or ``model_turn_id``)."""
    if not isinstance(payload, Mapping):
        return None
    return coerce_int(payload.get("duplex_turn_id", payload.get("model_turn_id")))


def coerce_int(value: object) -> int | None:
    """An int from a bool, int, float or numeric text; None when it is not one."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float | str | bytes | bytearray):
        try:
            return int(value)
        except (TypeError, ValueError, OverflowError):
            return None
    return None


__all__ = [
    "DefaultDuplexModelSessionState",
    "DuplexAppendPlan",
    "DuplexCapabilities",
    "DuplexDataPlane",
    "DuplexFence",
    "DuplexModelPlugin",
    "DuplexModelSessionState",
    "DuplexOutputDecision",
    "DuplexRuntimeConfigError",
    "DuplexSessionConfig",
    "EncodeAudio",
    "PartialStageForward",
    "PcmAppendBuffer",
    "PcmAppendReservation",
    "PrivateRuntimeKeyError",
    "coerce_int",
    "load_duplex_plugin",
    "payload_turn_id",
    "reject_changed_runtime_value",
    "reject_private_runtime_keys",
    "validate_duplex_plugin_sampling",
]
