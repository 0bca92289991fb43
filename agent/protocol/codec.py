"""The wire codec: typed events <-> JSON objects.

Inside the process audio is float32 numpy; base64 audio (pcm16 or pcm_f32le)
exists only here, where the realtime websocket, the browser's data channel and
the remote-server client meet the wire. A bad message raises ``ProtocolError``
with a distinct code.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

import numpy as np

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import decode_base64_audio, encode_base64_audio, parse_audio_format


def _registry(base: type[p.Event]) -> dict[str, type[p.Event]]:
    found: dict[str, type[p.Event]] = {}
    pending = list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # dataclass(slots=True) replaces each class; the replaced one lingers in
        # __subclasses__() until garbage-collected and must not be registered.
        if cls.type and "__slots__" in vars(cls):
            found[cls.type] = cls
    return found


CLIENT_EVENTS: dict[str, type[p.Event]] = _registry(p.ClientEvent)
SERVER_EVENTS: dict[str, type[p.Event]] = _registry(p.ServerEvent)
#: vLLM-Omni's alternative names for client events (``translate_realtime_command``).
CLIENT_ALIASES = {
    "input.commit": "input_audio_buffer.commit",
    "input.cancel": "input_audio_buffer.clear",
    "audio.playback_ack": "playback.ack",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "close": "session.close",
    "close_session": "session.close",
    "signal_turn": "turn.signal",
}
#: ``turn.signal`` events that are another client event in disguise: signal -> event type.
_SIGNALLED_EVENTS = ("barge_in", "input.cancel", "response.cancel", "session.update", "conversation.item.create",
                     "conversation.item.delete", "conversation.item.truncate")
#: Audio fields: event type -> (field inside the process, field on the wire).
_AUDIO_FIELDS: dict[type[p.Event], tuple[str, str]] = {
    p.InputAudioBufferAppend: ("audio", "audio"),
    p.ResponseAudioDelta: ("audio", "delta"),
}


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or annotation)


def decode_event(data: Any, registry: dict[str, type[p.Event]], *, audio_format: str = "pcm16") -> p.Event:
    """The typed event a JSON object describes, or ProtocolError.

    Base64 audio is decoded with the message's own ``format`` when it has one, else ``audio_format``.
    """
    if not isinstance(data, dict):
        raise p.ProtocolError("invalid_event", "an event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise p.ProtocolError("missing_field", "event has no string 'type'", event_id=event_id)
    if registry is CLIENT_EVENTS:
        data, kind = _client_wire_forms(data, event_id)
    cls = registry.get(kind)
    if cls is None:
        raise p.ProtocolError("unknown_event_type", f"unknown event type {kind!r}", event_id=event_id)
    hints = typing.get_type_hints(cls)
    audio_field, wire_field = _AUDIO_FIELDS.get(cls, ("", ""))
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        name = wire_field if f.name == audio_field else f.name
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                # vLLM-Omni's own code for an item command without its item (``realtime_commands``).
                code = "missing_item_id" if name == "item_id" else "missing_field"
                raise p.ProtocolError(code, f"{kind}: missing field {name!r}", event_id=event_id)
            continue
        value = data[name]
        if f.name == audio_field:
            kwargs[f.name] = _decode_audio(data, value, audio_format, kind, event_id)
            continue
        if not _matches(value, hints[f.name]):
            raise p.ProtocolError("invalid_field", f"{kind}: field {f.name!r} has the wrong type", event_id=event_id)
        kwargs[f.name] = float(value) if hints[f.name] is float else value
    return cls(**kwargs)


def _client_wire_forms(data: dict[str, Any], event_id: str | None) -> tuple[dict[str, Any], str]:
    """vLLM-Omni's other spellings of a client event -> the one ``CLIENT_EVENTS`` knows."""
    kind = CLIENT_ALIASES.get(data["type"], data["type"])
    if kind == "turn.signal" and data.get("event") in _SIGNALLED_EVENTS:
        payload = given if isinstance(given := data.get("payload"), dict) else {}
        kind = CLIENT_ALIASES.get(data["event"], data["event"])
        if kind == "session.update":
            payload = {"session": payload}
        elif kind == "response.cancel" and "response_id" not in payload and "response_id" in data:
            payload = {**payload, "response_id": data["response_id"]}
        data = {**payload, "event_id": event_id}
    elif kind == "session.update" and not isinstance(data.get("session"), dict):
        # A flat update: the session fields sit beside ``type``.
        data = {"session": {k: v for k, v in data.items() if k not in ("type", "event_id")}, "event_id": event_id}
    elif kind == "input_audio_buffer.commit" and "response_create" not in data:
        create = data.get("create_response", True if data["type"] == "input.commit" else None)
        data = {**data, "response_create": create if isinstance(create, bool) else None}
    elif kind == "input_audio_buffer.append":
        data = _append_rate(data, event_id)
    if event_id is None:
        data = {k: v for k, v in data.items() if k != "event_id"}
    return {**data, "type": kind}, kind


def _append_rate(data: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    """An append's own rate (``sample_rate_hz``, ``sample_rate`` or its format object's ``rate``) as ``sample_rate_hz``."""
    _, format_rate = parse_audio_format(data.get("format", data.get("input_audio_format")))
    rate = data.get("sample_rate_hz", data.get("sample_rate", format_rate))
    if rate is None:
        return data
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 1000 <= rate <= 384000 or rate != int(rate):
        raise p.ProtocolError("invalid_field", f"input_audio_buffer.append: bad sample rate {rate!r}",
                              event_id=event_id)
    return {**data, "sample_rate_hz": int(rate)}


def _decode_audio(data: dict[str, Any], value: Any, audio_format: str, kind: str, event_id: str | None) -> np.ndarray:
    if not isinstance(value, str):
        raise p.ProtocolError("invalid_field", f"{kind}: audio must be a base64 string", event_id=event_id)
    declared = data.get("format", data.get("input_audio_format"))
    name = audio_format if declared is None else parse_audio_format(declared)[0]
    if name is None:
        raise p.ProtocolError("unsupported_audio_format", f"{kind}: unsupported audio format {declared!r}",
                              event_id=event_id)
    try:
        return decode_base64_audio(value, name)
    except p.ProtocolError as exc:
        exc.event_id = exc.event_id or event_id
        raise


def decode_client_event(text: str | bytes, *, audio_format: str = "pcm16") -> p.ClientEvent:
    """A client event from one JSON text frame; appends decode with ``audio_format`` unless they name one."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise p.ProtocolError("invalid_json", f"message is not JSON: {exc}") from None
    event = decode_event(data, CLIENT_EVENTS, audio_format=audio_format)
    assert isinstance(event, p.ClientEvent)
    return event


def decode_server_event(data: Any) -> p.ServerEvent:
    event = decode_event(data, SERVER_EVENTS)
    assert isinstance(event, p.ServerEvent)
    return event


def encode_event(event: p.Event, *, audio_format: str = "pcm16") -> dict[str, Any]:
    """The JSON object for ``event``; audio goes out as base64 ``audio_format``."""
    audio_field, wire_field = _AUDIO_FIELDS.get(type(event), ("", ""))
    data: dict[str, Any] = {"type": event.type}
    for f in fields(event):
        value = getattr(event, f.name)
        if f.name == audio_field:
            data[wire_field] = encode_base64_audio(value, audio_format)
            data["format"] = audio_format
        else:
            data[f.name] = value
    return data

