"""``DuplexModelPlugin``: one model's engine policy and session policy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from duplex_agent.plugins.contract.data_plane import DuplexDataPlane, EncodeAudio
from duplex_agent.plugins.contract.engine import DuplexEngine
from duplex_agent.plugins.contract.state import DuplexModelSessionState
from duplex_agent.plugins.contract.types import (
    DuplexAppendPlan,
    DuplexCapabilities,
    DuplexFence,
    DuplexOutputDecision,
    DuplexSessionConfig,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


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


class DuplexModelPlugin(ABC):
    """Everything the runtime needs to know about one full-duplex model."""

    projects_intermediate_outputs: bool = False
    plugin_id: str = ""
    private_runtime_config_keys: frozenset[str] = frozenset()
    #: Samples per silence unit the runner appends to keep a model turn going.
    silence_continuation_samples: int = 16000
    data_plane: DuplexDataPlane
    #: The plugin's own settings: a dataclass of ``options.option()`` fields that the worker
    #: turns into flags; None when the plugin has none (see ``contract/options.py``).
    options_type: type[DataclassInstance] | None = None

    def __init__(self, encode_audio: EncodeAudio) -> None:
        # Concrete plugins hand the encoder to their data plane.
        del encode_audio

    def configure(self, options: Any, *, max_sessions: int) -> None:  # noqa: B027 (an optional hook: subclasses need not override it)
        """The worker's settings for this plugin, before ``build_local_engine``: an instance of
        ``options_type`` (None when it has none) and the worker's session limit."""

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
        output goes downstream only when the stage finishes. ``orchestrator`` is the
        session's stage router, which submits what this returns; ``replica_id`` is the
        stage's replica, always 0 here (one replica per stage). ``req_state`` is the
        request's scratch dict: the runner sets ``finished`` (this output ends the stage)
        and, for a response whose ``response.create`` gave options of its own (its
        ``tools``, ``tool_choice``), ``response_options`` (under vLLM-Omni's
        ``realtime_response_*`` keys).
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
    ) -> object:
        """What the data plane needs to project one response's outputs.

        ``speed`` is always None here: this runtime accepts a session's ``speed`` and ignores it.
        """

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

    def commit_model_function_item(self, *, session_id: str | None, item: Mapping[str, object]) -> None:
        """Keep a ``function_call`` or ``function_call_output`` item in the model's own context.

        Called at a turn boundary with ``commit_model_context``, each item in conversation
        order: the words the caller heard, the calls the client was told of (their
        announced ``call_id``), the outputs the client sent. No-op by default.
        """
        del session_id, item

    def plan_response_continuation(
        self,
        *,
        request_id: str,
        fence: DuplexFence,
        session_config: dict[str, object],
        runtime_config: dict[str, object],
        turn_seq: int,
        response_options: dict[str, object],
        sampling_params: tuple[object, ...],
    ) -> DuplexAppendPlan | None:
        """What to submit for a response that answers from the context alone, with no new input
        (the model's answer to function outputs): one plan, which opens ``request_id`` on the
        stage the plugin names; the runner reads its outputs as the response's, and, as with
        an append, a stage's outputs go on to the next. ``response_options`` are that
        ``response.create``'s own (``realtime_response_tools`` ...); ``sampling_params`` has
        one entry per stage. None: this model cannot continue (the client gets an error).
        """
        del request_id, fence, session_config, runtime_config, turn_seq, response_options, sampling_params
        return None

    def build_local_engine(self) -> DuplexEngine:
        """The engine that runs this model's stages in this process.

        Plugins served only by an external engine keep the default.
        """
        raise NotImplementedError(f"plugin {self.plugin_id!r} has no in-process engine")

    async def check_at_start(self) -> None:  # noqa: B027 (an optional hook: subclasses need not override it)
        """Once, as the worker starts, after ``build_local_engine``: check what the model needs
        outside this process (an endpoint it calls) and log a warning naming what is wrong. The
        worker starts anyway (the endpoint may come up later); keep it short and bounded."""
