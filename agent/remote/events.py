"""Server messages from a remote duplex server -> our typed events.

Both our endpoint and vLLM-Omni's send vLLM-Omni's shapes (``format`` and
``sample_rate_hz`` on audio deltas with a cumulative ``metadata.audio_duration_ms``
and ``audio_text_marks``, ``response.status`` nested in ``response.done``, flat
handshake errors, beta ``response.audio.*`` names); ours adds our flat fields
beside them. ``ServerMessageReader`` fills our fields from theirs before
decoding, and drops the events that have no counterpart here (item,
content-part and rate-limit bookkeeping).

A function call is a response of its own (see ``function_calls``); vLLM-Omni names no item in
its ``response.created``, so a ``response.created`` without one waits for the next message: when
that is the ``conversation.item.added`` of a call, the call's item is the response's item (and its
``function_call``, as on ``response.done``), and both come out of one ``read``.

vLLM-Omni's text marks count transcript characters (``text_chars``) while the
words themselves come in the transcript delta that follows each audio delta;
an audio delta whose marks point past the transcript known so far waits for
that next message, so its marks carry their words.
"""

from __future__ import annotations

import logging
from typing import Any

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import INPUT_FORMATS, parse_audio_format

log = logging.getLogger("duplex_agent.remote")

#: Server events with no counterpart in our vocabulary; skipped quietly.
IGNORED_TYPES = frozenset({
    "conversation.item.added", "conversation.item.created", "conversation.item.done",
    "conversation.item.truncated", "conversation.item.deleted",
    "response.output_item.added", "response.output_item.done", "response.content_part.added",
    "response.content_part.done", "rate_limits.updated", "playback.acknowledged", "overlap.decision",
    "turn.event", "session.heartbeat_ack",
})
#: Item events passed on when their item is a function call or its output: a call's response is
#: told by them, and an output's echo says the server took it.
_FUNCTION_ITEM_TYPES = frozenset({"conversation.item.added", "conversation.item.done", "response.output_item.added",
                                  "response.output_item.done"})
_FUNCTION_ITEMS = frozenset({"function_call", "function_call_output"})
#: A text-only reply's events (``TextDelta`` / ``TextDone``), read as its transcript.
_TEXT_TYPES = {"response.output_text.delta": "response.output_audio_transcript.delta",
               "response.output_text.done": "response.output_audio_transcript.done"}
_BETA_NAMES = {
    "response.audio.delta": "response.output_audio.delta",
    "response.audio.done": "response.output_audio.done",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
}


class ServerMessageReader:
    """Turns one conversation's server JSON objects into typed events, keeping per-response audio clocks."""

    def __init__(self, output_rate: int) -> None:
        self.output_rate = output_rate
        self._audio_ms: dict[str, float] = {}  # response -> audio received so far
        self._texts: dict[str, _ResponseText] = {}
        self._held: tuple[p.ResponseAudioDelta, list[dict[str, Any]]] | None = None
        self._held_created: p.ResponseCreated | None = None
        self._pending_marks: list[dict[str, Any]] = []  # the vLLM-Omni marks of the delta being read
        self._warned: set[str] = set()
        self._spoken: set[str] = set()  # responses with an audio transcript: their text events repeat it

    def read(self, data: Any) -> list[p.ServerEvent]:
        """The typed events this message completes (an audio delta held for its words comes first)."""
        kind = _wire_kind(data) if isinstance(data, dict) else None
        if kind == "response.output_audio_transcript.delta" and isinstance(data.get("delta"), str):
            self._text(str(data.get("response_id"))).text += data["delta"]
        released: list[p.ServerEvent] = []
        if self._held_created is not None:
            created, self._held_created = self._held_created, None
            call = data.get("item") if kind == "conversation.item.added" else None
            if isinstance(call, dict) and call.get("type") == "function_call" and isinstance(call.get("id"), str):
                created.item_id, created.function_call = call["id"], dict(call)
            released.append(created)
        if self._held is not None:
            (delta, marks), self._held = self._held, None
            delta.marks = self._marks(delta, marks)
            released.append(delta)
        self._pending_marks = []
        unnamed = kind == "response.created" and "item_id" not in data
        event = self._read_one(data)
        if isinstance(event, p.ResponseCreated) and unnamed:
            self._held_created = event  # its item is named by the next message
            return released
        if isinstance(event, p.ResponseAudioDelta) and self._pending_marks:
            if self._pending_marks[-1]["text_chars"] > len(self._text(event.response_id).text):
                self._held = (event, self._pending_marks)  # its words come with the next message
                return released
            event.marks = self._marks(event, self._pending_marks)
        return released + ([event] if event is not None else [])

    def _read_one(self, data: Any) -> p.ServerEvent | None:
        """The typed event, or None when the message is to be skipped (logged)."""
        if not isinstance(data, dict):
            log.warning("skipping a server message that is not a JSON object")
            return None
        kind = _wire_kind(data)
        if kind in IGNORED_TYPES and not _function_item_event(kind, data):
            return None
        if kind in _TEXT_TYPES:
            data = _text_as_transcript(data)
            if data is None or data["response_id"] in self._spoken:
                return None
            kind = _TEXT_TYPES[str(data["type"])]
        elif kind == "response.output_audio_transcript.delta" and isinstance(data.get("response_id"), str):
            self._spoken.add(data["response_id"])
        data = {**data, "type": kind}
        fill = _FILLERS.get(kind)
        if fill is not None:
            fill(self, data)
        try:
            event = codec.decode_server_event(data)
        except p.ProtocolError as exc:
            if exc.code != "unknown_event_type" or kind not in self._warned:
                log.warning("skipping server event %r: %s", kind, exc)
            self._warned.add(str(kind))
            return None
        if isinstance(event, p.ResponseDone):
            self._audio_ms.pop(event.response_id, None)
            self._texts.pop(event.response_id, None)
            self._spoken.discard(event.response_id)
        return event

    def _text(self, response_id: str) -> _ResponseText:
        return self._texts.setdefault(response_id, _ResponseText())

    def _marks(self, delta: p.ResponseAudioDelta, marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """vLLM-Omni's ``{text_chars, audio_end_ms}`` marks -> ours ``{text, start_ms, end_ms}``."""
        state = self._text(delta.response_id)
        ours = []
        for mark in marks:
            chars, end_ms = int(mark["text_chars"]), float(mark["audio_end_ms"])
            words = state.text[state.marked_chars:chars].strip()
            if words:
                ours.append({"text": words, "start_ms": max(state.marked_ms, delta.audio_start_ms), "end_ms": end_ms})
            state.marked_chars, state.marked_ms = max(state.marked_chars, chars), max(state.marked_ms, end_ms)
        return ours

    # ---- vLLM-Omni shapes -> ours ----

    def _delta(self, data: dict[str, Any]) -> None:
        _response_ids(data)
        meta = _object(data, "metadata")
        rate = data.get("sample_rate", data.get("sample_rate_hz", self.output_rate))
        data.setdefault("sample_rate", rate)
        if "audio_ms" not in data and isinstance(data.get("delta"), str) and isinstance(rate, int) and rate > 0:
            # This chunk's own length (``metadata.audio_duration_ms`` is the response's total so far).
            name = parse_audio_format(data.get("format", "pcm16"))[0]
            data["audio_ms"] = 1000.0 * (_base64_bytes(data["delta"]) // INPUT_FORMATS.get(name or "", 2)) / rate
        marks = meta.get("audio_text_marks")
        if "marks" not in data and isinstance(marks, list):
            self._pending_marks = [m for m in marks if isinstance(m, dict)
                                   and isinstance(m.get("text_chars"), int | float)
                                   and isinstance(m.get("audio_end_ms"), int | float)]
        response_id = data.get("response_id")
        if isinstance(response_id, str) and isinstance(data["audio_ms"], int | float):
            start = self._audio_ms.get(response_id, 0.0)
            data.setdefault("audio_start_ms", start)
            self._audio_ms[response_id] = start + data["audio_ms"]

    def _done(self, data: dict[str, Any]) -> None:
        _response_ids(data)
        response = _object(data, "response")
        data.setdefault("status", response.get("status"))
        details = response.get("status_details")
        if "reason" not in data and isinstance(details, dict) and isinstance(details.get("reason"), str):
            data["reason"] = details["reason"]
        output = response.get("output")
        first = output[0] if isinstance(output, list) and output else None
        if "function_call" not in data and isinstance(first, dict) and first.get("type") == "function_call":
            data["function_call"] = first  # the response is that call alone
        meta = _object(response, "metadata")
        playback = meta.get("playback")
        if "audio_ms" not in data and isinstance(playback, dict) and isinstance(playback.get("sent_ms"), int | float):
            data["audio_ms"] = playback["sent_ms"]

    def _listen(self, data: dict[str, Any]) -> None:
        response = _object(data, "response")
        meta = _object(response, "metadata")
        if "reason" not in data and isinstance(meta.get("reason"), str):
            data["reason"] = meta["reason"]

    def _error(self, data: dict[str, Any]) -> None:
        if not isinstance(data.get("error"), dict):  # vLLM-Omni's flat handshake shape
            data["error"] = {"type": "server_error", "code": data.get("code", "server_error"),
                             "message": str(data.get("error", "")), "event_id": None}


class _ResponseText:
    """One response's transcript so far, and how much of it marks have placed on the audio."""

    def __init__(self) -> None:
        self.text = ""
        self.marked_chars = 0
        self.marked_ms = 0.0


def _function_item_event(kind: Any, data: dict[str, Any]) -> bool:
    item = data.get("item")
    return kind in _FUNCTION_ITEM_TYPES and isinstance(item, dict) and item.get("type") in _FUNCTION_ITEMS


def _text_as_transcript(data: dict[str, Any]) -> dict[str, Any] | None:
    """``response.output_text.delta/done`` ({delta} / {text}) in the transcript's fields; None when unusable."""
    data = dict(data)
    _response_ids(data)
    if not isinstance(data.get("response_id"), str):
        return None
    if "text" in data and "transcript" not in data:
        data["transcript"] = data.pop("text")
    return data


def _wire_kind(data: dict[str, Any]) -> Any:
    """A message's ``type`` (any JSON value), a beta name in the GA spelling."""
    kind: Any = data.get("type")
    return _BETA_NAMES.get(kind, kind)


def _object(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` when it is a JSON object, else an empty one."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _base64_bytes(text: str) -> int:
    return len(text) * 3 // 4 - text[-2:].count("=")


def _response_ids(data: dict[str, Any]) -> None:
    """``response_id`` at the top level and an ``item_id`` (vLLM-Omni names items ``item_<response_id>``)."""
    response = data.get("response")
    if "response_id" not in data and isinstance(response, dict) and isinstance(response.get("id"), str):
        data["response_id"] = response["id"]
    if "item_id" not in data and isinstance(data.get("response_id"), str):
        data["item_id"] = f"item_{data['response_id']}"


_FILLERS = {
    "response.output_audio.delta": ServerMessageReader._delta,
    "response.done": ServerMessageReader._done,
    "response.listen": ServerMessageReader._listen,
    "error": ServerMessageReader._error,
    "response.created": lambda self, data: _response_ids(data),
    "response.speak": lambda self, data: _response_ids(data),
    "response.output_audio.done": lambda self, data: _response_ids(data),
    "response.output_audio_transcript.delta": lambda self, data: _response_ids(data),
    "response.output_audio_transcript.done": lambda self, data: _response_ids(data),
}

