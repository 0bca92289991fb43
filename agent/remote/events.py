"""Server messages from a remote duplex server -> our typed events.

Our own endpoint already speaks ``agent.protocol``. vLLM-Omni's speaks the same
names with a different shape in places (``sample_rate_hz`` and
``metadata.audio_duration_ms`` on audio deltas, ``response.status`` nested in
``response.done``, flat handshake errors, beta ``response.audio.*`` names);
``ServerMessageReader`` fills our fields from theirs before decoding, and
drops the events that have no counterpart here (item, content-part and
rate-limit bookkeeping).
"""

from __future__ import annotations

import logging
from typing import Any

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p

log = logging.getLogger("duplex_agent.remote")

#: Server events with no counterpart in our vocabulary; skipped quietly.
IGNORED_TYPES = frozenset({
    "conversation.item.added", "conversation.item.created", "conversation.item.done",
    "conversation.item.truncated", "conversation.item.deleted", "conversation.item.retrieved",
    "response.output_item.added", "response.output_item.done", "response.content_part.added",
    "response.content_part.done", "rate_limits.updated", "playback.acknowledged", "overlap.decision",
    "turn.event", "session.heartbeat_ack", "response.output_text.delta", "response.output_text.done",
})
_BETA_NAMES = {
    "response.audio.delta": "response.output_audio.delta",
    "response.audio.done": "response.output_audio.done",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
}
_PCM_WIDTH = {"pcm16": 2, "pcm_f32le": 4}


class ServerMessageReader:
    """Turns one conversation's server JSON objects into typed events, keeping per-response audio clocks."""

    def __init__(self, output_rate: int) -> None:
        self.output_rate = output_rate
        self._audio_ms: dict[str, float] = {}  # response -> audio received so far
        self._warned: set[str] = set()

    def read(self, data: Any) -> p.ServerEvent | None:
        """The typed event, or None when the message is to be skipped (logged)."""
        if not isinstance(data, dict):
            log.warning("skipping a server message that is not a JSON object")
            return None
        kind = _BETA_NAMES.get(data.get("type"), data.get("type"))  # type: ignore[arg-type]
        if kind in IGNORED_TYPES:
            return None
        data = {**data, "type": kind}
        fill = _FILLERS.get(kind)  # type: ignore[arg-type]
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
        return event

    # ---- vLLM-Omni shapes -> ours ----

    def _delta(self, data: dict[str, Any]) -> None:
        _response_ids(data)
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        rate = data.get("sample_rate", data.get("sample_rate_hz", self.output_rate))
        data.setdefault("sample_rate", rate)
        if "audio_ms" not in data:
            duration = meta.get("audio_duration_ms")
            if not isinstance(duration, int | float) and isinstance(data.get("delta"), str) and isinstance(rate, int):
                width = _PCM_WIDTH.get(str(data.get("format", "pcm16")), 2)
                duration = 1000.0 * (len(data["delta"]) * 3 // 4 // width) / rate
            data["audio_ms"] = duration
        response_id = data.get("response_id")
        if isinstance(response_id, str) and isinstance(data["audio_ms"], int | float):
            start = self._audio_ms.get(response_id, 0.0)
            data.setdefault("audio_start_ms", start)
            self._audio_ms[response_id] = start + data["audio_ms"]

    def _done(self, data: dict[str, Any]) -> None:
        _response_ids(data)
        response = data.get("response") if isinstance(data.get("response"), dict) else {}
        data.setdefault("status", response.get("status"))
        details = response.get("status_details")
        if "reason" not in data and isinstance(details, dict) and isinstance(details.get("reason"), str):
            data["reason"] = details["reason"]
        meta = response.get("metadata") if isinstance(response.get("metadata"), dict) else {}
        playback = meta.get("playback")
        if "audio_ms" not in data and isinstance(playback, dict) and isinstance(playback.get("sent_ms"), int | float):
            data["audio_ms"] = playback["sent_ms"]

    def _listen(self, data: dict[str, Any]) -> None:
        response = data.get("response") if isinstance(data.get("response"), dict) else {}
        meta = response.get("metadata") if isinstance(response.get("metadata"), dict) else {}
        if "reason" not in data and isinstance(meta.get("reason"), str):
            data["reason"] = meta["reason"]

    def _error(self, data: dict[str, Any]) -> None:
        if not isinstance(data.get("error"), dict):  # vLLM-Omni's flat handshake shape
            data["error"] = {"type": "server_error", "code": data.get("code", "server_error"),
                             "message": str(data.get("error", "")), "event_id": None}


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

