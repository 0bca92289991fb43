"""``session.update`` payloads -> ``DuplexSessionConfig``, with typed errors.

Both dialects are accepted: ours (``input_sample_rate``, ``overlap_policy`` ``barge_in`` |
``listen``) and vLLM-Omni's (``sample_rate_hz``, the GA ``audio{input{format{type, rate}}}``
object, ``overlap_policy`` ``barge_in_on_speech`` | ``listen_only``, ``ref_audio``,
``playback_commit_policy``, ``idle_timeout_s`` ...). vLLM-Omni's policy names come with its
rules: ``barge_in_on_speech`` needs ``turn_detection`` ``server_vad``, ``listen_only`` needs
``turn_detection`` null, and ``interrupt_response`` false is refused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from duplex_agent.agent.models.vad import VadSettings, VadSettingsError
from duplex_agent.agent.protocol.audio import INPUT_FORMATS, SUPPORTED_RATES, parse_audio_format
from duplex_agent.agent.protocol.events import ProtocolError
from duplex_agent.agent.protocol.tools import TOOL_CHOICE_KEY, TOOLS_KEY, check_tool_choice, check_tools
from duplex_agent.plugins.contract import DuplexSessionConfig

OVERLAP_POLICIES = ("barge_in", "listen")
#: vLLM-Omni's overlap policy names -> ours.
OMNI_OVERLAP_POLICIES = {"barge_in_on_speech": "barge_in", "listen_only": "listen"}
#: Fixed once the session has started: the input stream's shape.
IMMUTABLE_FIELDS = ("input_audio_format", "input_sample_rate")
#: Accepted for compatibility with realtime clients; not used by the runtime.
IGNORED_FIELDS = frozenset(
    {"model", "type", "object", "id", "session_id", "temperature",
     "max_response_output_tokens", "max_tokens", "max_output_tokens", "input_audio_transcription",
     "input_audio_noise_reduction", "speed", "tracing", "response_format", "include",
     # vLLM-Omni's: a reference voice clip (MiniCPM-o's voice; our models bring their own),
     # its overlap heuristics, and its playback commit policy: any is taken (vLLM-Omni normalizes an
     # unknown one, an older client's ``ack``, to its default); our ledger follows the acks under each.
     "ref_audio", "overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms", "playback_commit_policy"}
)
#: Fields with a type check and nothing else to apply: value type.
_CHECKED_ONLY: dict[str, tuple[type, ...]] = {
    "ref_audio": (str, type(None)),
    "overlap_short_ack_ms": (int, float),
    "overlap_barge_in_ms": (int, float),
    "overlap_silence_rms": (int, float),
    "playback_commit_policy": (str,),
}

_TYPES: dict[str, tuple[type, ...]] = {
    "instructions": (str,),
    "voice": (str, type(None)),
    "modalities": (list,),
    "input_audio_format": (str, dict),
    "input_sample_rate": (int,),
    "output_audio_format": (str, dict),
    "turn_detection": (dict, type(None)),
    "overlap_policy": (str,),
    "extra_body": (dict,),
    "idle_timeout_s": (int, float),
}


def apply_session_update(current: DuplexSessionConfig, update: dict[str, Any], *, started: bool) -> DuplexSessionConfig:
    """The config after ``update``; raises ProtocolError naming the first bad field."""
    update = _fold_omni_fields(update)
    _check_omni_policy(update)
    changes: dict[str, Any] = {}
    tool_fields = _tool_fields(update, current.extra_body)
    if tool_fields is not None:
        changes["extra_body"] = tool_fields
    for key, value in update.items():
        if key in _CHECKED_ONLY and (not isinstance(value, _CHECKED_ONLY[key]) or isinstance(value, bool)):
            raise ProtocolError("invalid_field", f"session.update: field {key!r} has the wrong type")
        if key in IGNORED_FIELDS:
            continue
        expected = _TYPES.get(key)
        if expected is None:
            raise ProtocolError("unknown_session_field", f"session.update: unknown field {key!r}")
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ProtocolError("invalid_field", f"session.update: field {key!r} has the wrong type")
        if key == "extra_body":
            # On top of the tools this update put there, if any.
            base: dict[str, object] = changes.get("extra_body", current.extra_body)
            value = {**base, **update[key]}
        changes[key] = value

    for key in ("input_audio_format", "output_audio_format"):
        if key in changes:
            name, rate = parse_audio_format(changes[key])
            if name is None or name not in INPUT_FORMATS or (key == "output_audio_format" and name != "pcm16"):
                allowed = sorted(INPUT_FORMATS) if key == "input_audio_format" else ["pcm16"]
                raise ProtocolError("unsupported_audio_format", f"{key} must be one of {allowed}")
            changes[key] = name
            if key == "input_audio_format" and rate is not None:
                changes.setdefault("input_sample_rate", rate)
    if "input_sample_rate" in changes and changes["input_sample_rate"] not in SUPPORTED_RATES:
        raise ProtocolError("unsupported_sample_rate", f"input_sample_rate must be one of {sorted(SUPPORTED_RATES)}")
    if "overlap_policy" in changes:
        policy = OMNI_OVERLAP_POLICIES.get(changes["overlap_policy"], changes["overlap_policy"])
        if policy not in OVERLAP_POLICIES:
            raise ProtocolError("invalid_field", f"overlap_policy must be one of "
                                f"{list(OVERLAP_POLICIES) + list(OMNI_OVERLAP_POLICIES)}")
        changes["overlap_policy"] = policy
    if "idle_timeout_s" in changes and not changes.pop("idle_timeout_s") > 0:
        raise ProtocolError("invalid_field", "idle_timeout_s must be a positive number of seconds")
    if "modalities" in changes:
        modalities = changes["modalities"]
        if not modalities or any(m not in ("audio", "text") for m in modalities):
            raise ProtocolError("invalid_field", "modalities must be a non-empty list of 'audio' and 'text'")
        changes["modalities"] = tuple(modalities)
    if changes.get("turn_detection") is not None:
        changes["turn_detection"] = _vad_settings_dict(changes["turn_detection"])
    if started:
        for key in IMMUTABLE_FIELDS:
            if key in changes and changes[key] != getattr(current, key):
                raise ProtocolError("session_field_immutable", f"{key} cannot change after the session started")
    return replace(current, **changes)


def _tool_fields(update: dict[str, Any], extra_body: dict[str, object]) -> dict[str, object] | None:
    """``tools`` and ``tool_choice`` taken out of ``update`` into a new ``extra_body`` (vLLM-Omni's
    ``realtime_tools``, ``realtime_tool_choice``; null removes them), or None when neither came."""
    if "tools" not in update and "tool_choice" not in update:
        return None
    extra = dict(extra_body)
    for field, key, check in (("tools", TOOLS_KEY, check_tools), ("tool_choice", TOOL_CHOICE_KEY, check_tool_choice)):
        if field not in update:
            continue
        value = update.pop(field)
        if value is None:
            extra.pop(key, None)
        else:
            extra[key] = check(value)
    return extra


def _fold_omni_fields(update: dict[str, Any]) -> dict[str, Any]:
    """vLLM-Omni's spellings (GA ``audio{}`` object, ``sample_rate_hz``, ``output_modalities``) -> ours."""
    update = dict(update)
    audio = update.pop("audio", None)
    if audio is not None:
        if not isinstance(audio, dict):
            raise ProtocolError("invalid_field", "session.update: field 'audio' must be an object")
        for side, key in (("input", "input_audio_format"), ("output", "output_audio_format")):
            part = audio.get(side)
            if not isinstance(part, dict):
                continue
            if "format" in part:
                update.setdefault(key, part["format"])
            rate = part.get("sample_rate_hz", part.get("sample_rate"))
            if side == "input" and rate is not None:
                update.setdefault("sample_rate_hz", rate)
            if side == "input" and "turn_detection" in part:
                update["turn_detection"] = part["turn_detection"]
    for alias in ("sample_rate_hz", "sample_rate"):
        if alias in update:
            update.setdefault("input_sample_rate", update.pop(alias))
    if "output_modalities" in update:
        update.setdefault("modalities", update.pop("output_modalities"))
    return update


def _check_omni_policy(update: dict[str, Any]) -> None:
    """vLLM-Omni's pairing of its overlap policy names with ``turn_detection`` (its ``unsupported_turn_detection``)."""
    policy = update.get("overlap_policy")
    detection = update.get("turn_detection", ...)
    if isinstance(detection, dict) and detection.get("interrupt_response", True) is not True:
        raise ProtocolError("invalid_turn_detection", "turn_detection.interrupt_response=false is unsupported; use "
                            "turn_detection=null for model-owned listen/speak")
    if policy not in OMNI_OVERLAP_POLICIES:
        return
    wanted = "listen_only" if detection is None else "barge_in_on_speech"
    if detection is ... and policy == "barge_in_on_speech":
        raise ProtocolError("invalid_turn_detection", "overlap_policy='barge_in_on_speech' requires "
                            "turn_detection.type='server_vad'")
    if detection is not ... and policy != wanted:
        raise ProtocolError("invalid_turn_detection", f"overlap_policy={policy!r} conflicts with turn_detection; "
                            f"expected {wanted!r}")


def _vad_settings_dict(detection: dict[str, Any]) -> dict[str, Any]:
    """``turn_detection`` validated by ``VadSettings``; vLLM-Omni's ``min_speech_duration_ms`` is its ``min_speech_ms``."""
    detection = dict(detection)
    if "min_speech_duration_ms" in detection and "min_speech_duration_ms" not in VadSettings.KEYS:
        detection.setdefault("min_speech_ms", detection.pop("min_speech_duration_ms"))
        detection.pop("min_speech_duration_ms", None)
    try:
        VadSettings.from_dict(detection)
    except VadSettingsError as exc:
        raise ProtocolError("invalid_turn_detection", str(exc)) from None
    return detection


def session_config_dict(config: DuplexSessionConfig) -> dict[str, Any]:
    """The session as its events show it; ``tools`` and ``tool_choice`` only once set (vLLM-Omni's
    ``as_public_dict`` shows them from its ``extra_body`` the same way)."""
    shown: dict[str, Any] = {
        "instructions": config.instructions,
        "voice": config.voice,
        "modalities": list(config.modalities),
        "input_audio_format": config.input_audio_format,
        "input_sample_rate": config.input_sample_rate,
        "output_audio_format": config.output_audio_format,
        "turn_detection": config.turn_detection,
        "overlap_policy": config.overlap_policy,
    }
    for field, key in (("tools", TOOLS_KEY), ("tool_choice", TOOL_CHOICE_KEY)):
        if config.extra_body.get(key) is not None:
            shown[field] = config.extra_body[key]
    return shown
