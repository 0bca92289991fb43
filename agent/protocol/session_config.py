"""``session.update`` payloads -> ``DuplexSessionConfig``, with typed errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from duplex_agent.agent.models.vad import VadSettings, VadSettingsError
from duplex_agent.agent.protocol.audio import INPUT_FORMATS, SUPPORTED_RATES
from duplex_agent.agent.protocol.events import ProtocolError
from duplex_agent.plugins.contract import DuplexSessionConfig

OVERLAP_POLICIES = ("barge_in", "listen")
#: Fixed once the session has started: the input stream's shape.
IMMUTABLE_FIELDS = ("input_audio_format", "input_sample_rate")
#: Accepted for compatibility with realtime clients; not used by the runtime.
IGNORED_FIELDS = frozenset(
    {"model", "type", "object", "id", "temperature", "tools", "tool_choice", "max_response_output_tokens",
     "input_audio_transcription", "input_audio_noise_reduction", "speed", "tracing"}
)

_TYPES: dict[str, tuple[type, ...]] = {
    "instructions": (str,),
    "voice": (str, type(None)),
    "modalities": (list,),
    "input_audio_format": (str,),
    "input_sample_rate": (int,),
    "output_audio_format": (str,),
    "turn_detection": (dict, type(None)),
    "overlap_policy": (str,),
    "extra_body": (dict,),
}


def apply_session_update(current: DuplexSessionConfig, update: dict[str, Any], *, started: bool) -> DuplexSessionConfig:
    """The config after ``update``; raises ProtocolError naming the first bad field."""
    changes: dict[str, Any] = {}
    for key, value in update.items():
        if key in IGNORED_FIELDS:
            continue
        expected = _TYPES.get(key)
        if expected is None:
            raise ProtocolError("unknown_session_field", f"session.update: unknown field {key!r}")
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ProtocolError("invalid_field", f"session.update: field {key!r} has the wrong type")
        changes[key] = value

    if "input_audio_format" in changes and changes["input_audio_format"] not in INPUT_FORMATS:
        raise ProtocolError("unsupported_audio_format", f"input_audio_format must be one of {sorted(INPUT_FORMATS)}")
    if "output_audio_format" in changes and changes["output_audio_format"] != "pcm16":
        raise ProtocolError("unsupported_audio_format", "output_audio_format must be 'pcm16'")
    if "input_sample_rate" in changes and changes["input_sample_rate"] not in SUPPORTED_RATES:
        raise ProtocolError("unsupported_sample_rate", f"input_sample_rate must be one of {sorted(SUPPORTED_RATES)}")
    if "overlap_policy" in changes and changes["overlap_policy"] not in OVERLAP_POLICIES:
        raise ProtocolError("invalid_field", f"overlap_policy must be one of {list(OVERLAP_POLICIES)}")
    if "modalities" in changes:
        modalities = changes["modalities"]
        if not modalities or any(m not in ("audio", "text") for m in modalities):
            raise ProtocolError("invalid_field", "modalities must be a non-empty list of 'audio' and 'text'")
        changes["modalities"] = tuple(modalities)
    if changes.get("turn_detection") is not None:
        try:
            VadSettings.from_dict(changes["turn_detection"])
        except VadSettingsError as exc:
            raise ProtocolError("invalid_turn_detection", str(exc)) from None
    if started:
        for key in IMMUTABLE_FIELDS:
            if key in changes and changes[key] != getattr(current, key):
                raise ProtocolError("session_field_immutable", f"{key} cannot change after the session started")
    return replace(current, **changes)


def session_config_dict(config: DuplexSessionConfig) -> dict[str, Any]:
    return {
        "instructions": config.instructions,
        "voice": config.voice,
        "modalities": list(config.modalities),
        "input_audio_format": config.input_audio_format,
        "input_sample_rate": config.input_sample_rate,
        "output_audio_format": config.output_audio_format,
        "turn_detection": config.turn_detection,
        "overlap_policy": config.overlap_policy,
    }
