"""The transport's client events as a remote server's wire messages.

Pure functions: each takes a typed client event and what it needs to know of the session
(passed in) and returns the JSON objects to send. The state they read (the input encoder, the
responses, the acks owed) stays with ``RemoteConversation``, which calls them.
"""

from __future__ import annotations

import logging
from typing import Any

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import INPUT_FORMATS, SUPPORTED_RATES, parse_audio_format
from duplex_agent.agent.protocol.tools import check_tool_choice, check_tools
from duplex_agent.agent.remote.session import RemoteSession, translate_session_update
from duplex_agent.plugins.contract import DuplexCapabilities

log = logging.getLogger("duplex_agent.remote")

DTMF_DIGITS = frozenset("0123456789*#ABCD")


def wire(event: p.ClientEvent) -> dict[str, Any]:
    """A client event as JSON, without the optional fields it leaves unset."""
    return {k: v for k, v in codec.encode_event(event).items() if v is not None}


def appends(packets: list[tuple[str, float]], *, audio_format: str, sample_rate_hz: int
            ) -> list[tuple[dict[str, Any], float]]:
    """Server appends of encoded ``(audio, ms)`` packets, each with its ms of audio; every append names
    its format and rate (vLLM-Omni honours both per append)."""
    return [({"type": "input_audio_buffer.append", "audio": audio, "format": audio_format,
              "sample_rate_hz": sample_rate_hz}, ms) for audio, ms in packets]


def commit(event: p.InputAudioBufferCommit, remote: RemoteSession) -> dict[str, Any]:
    message = wire(event)
    if remote.extended and event.response_create is None:
        message["response_create"] = True  # vLLM-Omni's default is false: no reply would follow
    return message


def input_audio(event: p.SessionUpdate, *, current: tuple[str, int], started: bool) -> tuple[str, int]:
    """The transport's input format and rate once ``event`` applies (``current`` until then);
    ProtocolError when refused. ``started``: the transport's first update went out already."""
    update = event.session
    audio_format = parse_audio_format(update.get("input_audio_format", current[0]))[0]
    rate = update.get("input_sample_rate", update.get("sample_rate_hz", current[1]))
    if started and (audio_format, rate) != current:
        raise p.ProtocolError("session_field_immutable", "the input audio format and rate cannot change "
                              "after the session started", event_id=event.event_id)
    if audio_format not in INPUT_FORMATS:
        raise p.ProtocolError("unsupported_audio_format",
                              f"input_audio_format must be one of {sorted(INPUT_FORMATS)}", event_id=event.event_id)
    if rate not in SUPPORTED_RATES:
        raise p.ProtocolError("unsupported_sample_rate", f"input_sample_rate must be one of "
                              f"{sorted(SUPPORTED_RATES)}", event_id=event.event_id)
    return audio_format, rate


def session_update(event: p.SessionUpdate, remote: RemoteSession) -> dict[str, Any]:
    message = {"type": "session.update", "session": translate_session_update(event.session, remote)}
    if event.event_id:
        message["event_id"] = event.event_id
    return message


def check_tool_fields(fields: dict[str, Any], caps: DuplexCapabilities, event_id: str | None) -> dict[str, Any]:
    """``fields`` (a ``session`` or ``response`` object) with its ``tools`` and ``tool_choice`` checked, as
    the server gets them; ProtocolError before anything is sent when they are malformed, or when the
    model cannot call tools. ``null`` clears them, as on vLLM-Omni."""
    if fields.get("tools") is None and fields.get("tool_choice") is None:
        return fields
    checked = dict(fields)
    if checked.get("tools") is not None:
        checked["tools"] = check_tools(checked["tools"], event_id=event_id)
        if checked["tools"] and not caps.supports_tools:
            raise p.ProtocolError("tools_unsupported", f"the model {caps.plugin_id!r} cannot call tools",
                                  event_id=event_id)
    if checked.get("tool_choice") is not None:
        checked["tool_choice"] = check_tool_choice(checked["tool_choice"], event_id=event_id)
    return checked


def dtmf_digit(event: p.InputDtmf) -> str:
    """The key pressed; ProtocolError for anything but a keypad digit. (Our extension: answered by the
    client, never sent, as vLLM-Omni would answer ``unknown_event``.)"""
    if event.digit not in DTMF_DIGITS:
        raise p.ProtocolError("invalid_field", f"DTMF digit must be one of {''.join(sorted(DTMF_DIGITS))}",
                              event_id=event.event_id)
    return event.digit


def barge_in_ends_here(event: p.ResponseCancel, caps: DuplexCapabilities) -> bool:
    """A barge-in on a model that cannot be interrupted: the edge has gone quiet, the response ends
    on this side and nothing is sent."""
    return event.reason == "barge_in" and not caps.supports_barge_in


def cancel(event: p.ResponseCancel, response_id: str | None, remote: RemoteSession) -> list[dict[str, Any]]:
    """The cancel of ``response_id`` (None: whatever the server is doing) for ``event``."""
    if barge_in_ends_here(event, remote.capabilities):
        return []
    if event.reason == "barge_in" and remote.extended:
        return [{"type": "barge_in"}]
    message: dict[str, Any] = {"type": "response.cancel"}
    if response_id:
        message["response_id"] = response_id
    if not remote.extended:
        message["reason"] = event.reason
    return [message]


def playback_ack(event: p.PlaybackAck, *, response_id: str, item_id: str | None, cut: bool,
                 caps: DuplexCapabilities) -> list[dict[str, Any]]:
    """The transport's ack of ``response_id`` (``item_id``), or the truncate that stands in for it on a
    server without acks; nothing on a server with neither. ``cut``: the edge stopped the response."""
    if caps.supports_playback_ack:
        committed = event.played_ms if event.committed_ms is None else event.committed_ms
        return [ack(response_id, item_id, event.played_ms, committed, truncate=event.truncate or cut, caps=caps)]
    if caps.supports_truncation and item_id:
        return [{"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                 "audio_end_ms": event.played_ms}]
    return []


def ack(response_id: str, item_id: str | None, played_ms: float, committed_ms: float, *, truncate: bool,
        caps: DuplexCapabilities, event_id: str | None = None) -> dict[str, Any]:
    """``playback.ack``, the transport's or one sent for it; ``truncate`` where the server can."""
    message: dict[str, Any] = {"type": "playback.ack", "response_id": response_id, "played_ms": played_ms,
                               "committed_ms": committed_ms}
    if event_id:
        message["event_id"] = event_id
    if item_id:
        message["item_id"] = item_id
    if truncate and caps.supports_truncation:
        message["truncate"] = True
    return message


def forwarded(event: p.ClientEvent, caps: DuplexCapabilities) -> list[dict[str, Any]]:
    """Any other client event, as it is; a truncate only where the server can truncate."""
    if isinstance(event, p.ConversationItemTruncate) and not caps.supports_truncation:
        log.debug("the server cannot truncate items; dropping %s", event.type)
        return []
    return [wire(event)]
