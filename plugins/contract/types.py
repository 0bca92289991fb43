"""The value types the contract passes around: capabilities, session config, fences, plans, decisions,
and the errors and checks a plugin uses on runtime configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


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
    #: The weights are random (a test or demo model): what it says means nothing, and the page says so.
    random_weights: bool = False
    #: The model can call the session's tools (``function_call`` items); without it, ``tools`` are refused.
    supports_tools: bool = False
    #: After a ``function_call_output`` the model answers by itself; otherwise the caller of the tool
    #: sends ``response.create`` (LiveKit Agents' ``auto_tool_reply_generation``).
    replies_to_tool_output: bool = False
    #: The model can say a given text word for word in its own voice (``response.create`` with our
    #: ``response.say``): a greeting from the settings, a voicemail message.
    speaks_given_text: bool = False

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
    """The epoch (and, for the record, the turn) a piece of work was started under.

    The epoch advances on every cancel, clear and barge-in; work started in another
    epoch is stale and its results are dropped. Only the epoch decides (``admits``):
    ``turn_id`` travels with the work for the plugin and the logs.
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


def payload_turn_id(payload: object) -> int | None:
    """The turn id a payload carries (``duplex_turn_id`` or ``model_turn_id``).

    The runner puts ``duplex_turn_id`` on every append payload: the user turn the audio belongs to.
    """
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
