"""What a remote duplex server told us in ``session.created``, and how we talk to it.

Two dialects share the vocabulary: our own endpoint puts ``DuplexCapabilities``
fields in ``session.capabilities``; vLLM-Omni's puts its own names there
(``supports_session_resume``, ``chunk_period_ms``, ``implementation_level``)
and the input rate under ``session.audio.input``. Both are read into one
``RemoteSession``; the client branches on its fields, never on a model name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from duplex_agent.agent.protocol.audio import INPUT_FORMATS, parse_audio_format
from duplex_agent.agent.protocol.events import ProtocolError
from duplex_agent.plugins.contract import DuplexCapabilities

#: Session fields that describe the transport's own audio; they never reach the server.
LOCAL_AUDIO_FIELDS = ("input_audio_format", "input_sample_rate")
#: Our overlap policies in vLLM-Omni's names (its ``overlap_policy`` values).
_EXTENDED_OVERLAP = {"barge_in": "barge_in_on_speech", "listen": "listen_only"}


@dataclass(frozen=True, slots=True)
class RemoteSession:
    session_id: str
    capabilities: DuplexCapabilities
    #: The wire format and rate the server expects input in.
    input_format: str
    input_rate: int
    resume_token: str | None = None
    incarnation: int | None = None
    #: The server speaks vLLM-Omni's duplex extras (``barge_in``, ``session.close``, ``session.event_ack``).
    extended: bool = False


def _first_int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _audio_rate(session: dict[str, Any], direction: str) -> int | None:
    audio = session.get("audio")
    side = audio.get(direction) if isinstance(audio, dict) else None
    if not isinstance(side, dict):
        return None
    fmt = side.get("format")
    return _first_int(side.get("sample_rate_hz"), fmt.get("rate") if isinstance(fmt, dict) else None)


def parse_session_created(data: dict[str, Any], *, model: str, max_sessions: int) -> RemoteSession:
    """Read a ``session.created`` message (raw JSON object); ProtocolError when it is unusable."""
    session = data.get("session")
    if not isinstance(session, dict):
        raise ProtocolError("invalid_session_created", "session.created carries no session object")
    caps = session.get("capabilities")
    caps = caps if isinstance(caps, dict) else {}
    extended = "implementation_level" in caps or "supports_session_resume" in caps
    input_rate = _first_int(session.get("input_sample_rate"), _audio_rate(session, "input"),
                            caps.get("input_sample_rate")) or 16000
    declared = session.get("input_audio_format", "pcm16")
    input_format = parse_audio_format(declared)[0]
    if input_format not in INPUT_FORMATS:
        raise ProtocolError("unsupported_audio_format", f"the server wants input as {declared!r}")
    unit_ms = caps.get("chunk_period_ms")
    unit_samples = _first_int(caps.get("unit_samples"),
                              round(unit_ms * input_rate / 1000) if isinstance(unit_ms, int | float) else None)
    # Our endpoint says which; every model on vLLM-Omni's is model-native (continuous).
    declared_mode = caps.get("input_mode")
    input_mode: Literal["continuous", "turn"] = (
        "continuous" if declared_mode == "continuous" else "turn" if declared_mode == "turn"
        else "continuous" if extended else "turn")
    capabilities = DuplexCapabilities(
        plugin_id=str(caps.get("plugin_id") or session.get("model") or model or "remote"),
        input_sample_rate=input_rate,
        unit_samples=unit_samples or input_rate // 10,
        output_sample_rate=_first_int(caps.get("output_sample_rate"), _audio_rate(session, "output")) or 24000,
        max_sessions=max_sessions,
        input_mode=input_mode,
        input_formats=tuple(caps.get("input_formats") or (input_format,)),
        supports_barge_in=bool(caps.get("supports_barge_in", False)),
        # vLLM-Omni takes playback.ack from every model; ours says so in the capabilities.
        supports_playback_ack=bool(caps.get("supports_playback_ack", extended)),
        supports_truncation=bool(caps.get("supports_truncation", caps.get("supports_audio_truncate", False))),
        supports_resume=bool(caps.get("supports_session_resume", caps.get("supports_resume", False))),
        handles_overlap=bool(caps.get("handles_overlap", extended)),
        random_weights=bool(caps.get("random_weights", False)),
        # Ours says whether its model says a given text (a greeting, a voicemail message); vLLM-Omni's
        # models answer only what they hear.
        speaks_given_text=bool(caps.get("speaks_given_text", False)),
        # vLLM-Omni names no tool capability. It carries tools for every plugin, but answers an output
        # only by continuing the model's own stage request (its ``maybe_continue_response``): a plugin
        # without a resumable request ends the turn at the output and refuses the ``response.create``
        # after it (``response_create_without_input``), so its tool loop cannot close. Ours says both.
        supports_tools=bool(caps.get("supports_tools", caps.get("supports_core_resumable_request", False))),
        replies_to_tool_output=bool(caps.get("replies_to_tool_output",
                                             caps.get("supports_core_resumable_request", False))),
    )
    token = data.get("resume_token")
    incarnation = data.get("incarnation")
    return RemoteSession(
        session_id=str(session.get("id") or data.get("session_id") or ""),
        capabilities=capabilities,
        input_format=input_format,
        input_rate=input_rate,
        resume_token=token if isinstance(token, str) and token else None,
        incarnation=incarnation if isinstance(incarnation, int) else None,
        extended=extended,
    )


def tool_capabilities(caps: DuplexCapabilities, *, tools: bool | None,
                      replies_to_tool_output: bool | None) -> DuplexCapabilities:
    """``caps`` with the operator's word on tools where given: a vLLM-Omni server does not say which
    of its plugins calls them (Nemotron VoiceChat's does; MiniCPM-o's and PersonaPlex's ignore them)."""
    if tools is not None:
        caps = replace(caps, supports_tools=tools)
    if replies_to_tool_output is not None:
        caps = replace(caps, replies_to_tool_output=replies_to_tool_output)
    return caps


def translate_session_update(update: dict[str, Any], remote: RemoteSession) -> dict[str, Any]:
    """The transport's ``session`` fields as the server should get them.

    The transport's audio format and rate stay here (we re-encode). A model-native
    (continuous) server gets vLLM-Omni's pairs only, which its ``turn_detection``
    validator accepts: the listen setting (or a model that cannot be barged in on,
    or ``interrupt_response`` false) is ``turn_detection`` null with ``listen_only``;
    barge-in is ``server_vad`` with ``barge_in_on_speech``. A turn-based server (ours)
    commits turns with its VAD and takes our policy names.
    """
    out = {k: v for k, v in update.items() if k not in LOCAL_AUDIO_FIELDS}
    if not remote.extended or remote.capabilities.input_mode != "continuous":
        return out
    if "overlap_policy" not in out and "turn_detection" not in out:
        return out
    detection = out.get("turn_detection", {"type": "server_vad"})
    listen = (out.get("overlap_policy") in ("listen", "listen_only") or detection is None
              or not remote.capabilities.supports_barge_in
              or (isinstance(detection, dict) and detection.get("interrupt_response", True) is False))
    if listen:
        out["turn_detection"], out["overlap_policy"] = None, "listen_only"
    else:
        out["turn_detection"], out["overlap_policy"] = omni_turn_detection(detection), "barge_in_on_speech"
    return out


#: Our ``turn_detection`` keys -> vLLM-Omni's (keys it does not know are left out).
_OMNI_VAD_KEYS = {"type": "type", "threshold": "threshold", "prefix_padding_ms": "prefix_padding_ms",
                  "silence_duration_ms": "silence_duration_ms", "min_speech_ms": "min_speech_duration_ms",
                  "min_speech_duration_ms": "min_speech_duration_ms"}


def omni_turn_detection(detection: Any) -> dict[str, Any]:
    detection = detection if isinstance(detection, dict) else {}
    out = {_OMNI_VAD_KEYS[k]: v for k, v in detection.items() if k in _OMNI_VAD_KEYS}
    out["type"] = "server_vad"
    return out
