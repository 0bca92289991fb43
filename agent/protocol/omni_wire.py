"""Server events in vLLM-Omni's exact wire shapes.

Inside the process events stay flat (``ResponseDone.status``, ``ResponseAudioDelta.marks``);
``ServerWireEncoder`` turns them into what vLLM-Omni's ``/v1/realtime?duplex=1`` sends:
nested ``response{}`` objects, audio deltas with ``format`` / ``sample_rate_hz`` /
``output_index`` / ``content_index`` / ``metadata``, ``session`` objects with the GA
``audio{}`` object, vLLM-Omni's capability names and the session's ``state`` /
``turn_state`` / ``epoch`` / ``turn_id``, the native event echoed under ``event`` where
vLLM-Omni echoes one, a server ``event_id`` on every event, and vLLM-Omni's error codes
and classes (checked against vLLM-Omni 0.30.0's ``protocol.duplex.events`` and
``engine.duplex.realtime_events``). Our own flat fields stay beside them
(additions a vLLM-Omni client ignores), so clients of either dialect read the same JSON.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeGuard

from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import FORMAT_MIME

#: Our error codes -> vLLM-Omni's, where it has one for the same condition.
OMNI_ERROR_CODES = {
    "invalid_event": "bad_event",
    "missing_field": "bad_event",
    "invalid_field": "bad_event",
    "unknown_event_type": "unknown_event",
    "frame_too_large": "event_too_large",
    "invalid_audio_base64": "bad_audio",
    "invalid_audio_length": "bad_event",
    "invalid_audio_samples": "bad_audio",
    "response_cancel_not_active": "response_not_active",
    "input_audio_buffer_commit_empty": "input_audio_buffer_empty",
    "no_committed_input": "response_create_without_input",
    "invalid_turn_detection": "unsupported_turn_detection",
    "append_failed": "runtime_append_failed",
    "stage_failed": "response_error",
}
#: vLLM-Omni's error class per code (``REALTIME_ERROR_TYPES_BY_CODE``); any other code is a request error.
OMNI_ERROR_TYPES = {
    "internal_error": "server_error", "runtime_append_failed": "server_error", "response_error": "server_error",
    "runtime_open_failed": "server_error", "backend_disconnected": "server_error", "backend_stalled": "server_error",
    "backend_unavailable": "server_error",
    "resource_exhausted": "rate_limit_error", "duplex_session_busy": "rate_limit_error",
    "input_backpressure": "rate_limit_error", "shutting_down": "rate_limit_error",
}
#: Our overlap policies in vLLM-Omni's names.
OMNI_OVERLAP = {"barge_in": "barge_in_on_speech", "listen": "listen_only"}


def omni_error_code(code: str) -> str:
    return OMNI_ERROR_CODES.get(code, code)


def omni_error(code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An ``error`` event's ``error`` object: vLLM-Omni's code and class, the client's ``event_id``,
    and the field at fault where there is one (``param``)."""
    code = omni_error_code(code)
    error = {"type": OMNI_ERROR_TYPES.get(code, "invalid_request_error"), "code": code, "message": message,
             "event_id": event_id}
    if param:
        error["param"] = param
    return error


#: vLLM-Omni's ``DuplexCapabilities.as_dict()`` defaults, for the facts we have no own value for.
_OMNI_CAPABILITY_DEFAULTS: dict[str, Any] = {
    "supports_session_adapter": True, "supports_model_native_turn_policy": False,
    "supports_external_turn_signal": True, "supports_client_commit": True, "supports_playback_ack": True,
    "supports_replace_latest_chunk": False, "supports_reencode_context": False,
    "supports_rollback_to_checkpoint": False, "supports_turn_commit_only": True, "supports_kv_lease": False,
    "supports_core_kv_lease": False, "supports_model_internal_state": True, "supports_stage_resumption": False,
    "supports_scheduler_native_append": False, "supports_core_resumable_request": False,
    "supports_concurrent_turn_requests": False, "required_input_modalities": ["audio"],
    "optional_input_modalities": [], "supports_stage_connector_handoff": False,
    "supports_independent_io_streams": True, "supports_realtime_endpoint": True,
    "supports_multi_session_same_replica": True, "supports_session_lease": False,
    "session_admission_mode": "serving_managed", "supports_image_input": False,
    "supports_text_only_turn": False, "requires_model_runner_kv": False, "requires_native_stage_role": False,
    "adapter_patterns": ["chunk_group_append"], "stage_handoff_transport": "in_process",
    "target_barge_in_latency_ms": None,
}
#: vLLM-Omni's ``DuplexSessionConfig`` defaults for the session fields our config does not keep.
_OMNI_SESSION_DEFAULTS: dict[str, Any] = {
    "model": "duplex", "response_format": "wav", "temperature": None, "max_tokens": None, "speed": None,
    "idle_timeout_s": 300.0, "overlap_short_ack_ms": 700, "overlap_barge_in_ms": 1200,
    "overlap_silence_rms": 0.003, "playback_commit_policy": "commit_all_on_done",
    "input_audio_transcription": None, "tracing": None,
}


def omni_capabilities(caps: dict[str, Any], *, resumable: bool) -> dict[str, Any]:
    """Our ``DuplexCapabilities.to_dict()`` plus vLLM-Omni's names for the same facts."""
    continuous = caps.get("input_mode") == "continuous"
    return {
        **_OMNI_CAPABILITY_DEFAULTS,
        **caps,
        "supports_model_native_turn_policy": continuous,
        # Our endpoint keeps every session resumable, whatever the model.
        "supports_resume": resumable,
        "implementation_level": "model_native_duplex" if continuous else "server_turn_detection",
        "supports_input_append": True,
        "supports_barge_in": bool(caps.get("supports_barge_in")),
        "supports_session_resume": resumable,
        "supports_audio_truncate": bool(caps.get("supports_truncation")),
        "supports_multi_session": int(caps.get("max_sessions", 1)) > 1,
        "chunk_period_ms": round(float(caps.get("unit_ms", 0.0))),
        "input_modes": ["append_audio_chunk"],
        "signal_sources": ["model_native", "client_event", "server_policy"] if continuous
        else ["client_event", "server_policy"],
    }


#: A session's position: (epoch, turn_id), read when an event is encoded.
Fence = Callable[[], tuple[int, int]]
#: vLLM-Omni's ``DuplexTurnState`` after each event that moves it.
_TURN_STATES: dict[type[p.ServerEvent], str] = {
    p.SpeechStarted: "user_speaking",
    p.InputAudioBufferCommitted: "user_committed",
    p.ResponseCreated: "assistant_generating",
    p.ResponseListen: "idle",
    p.ResponseDone: "idle",
}


def omni_session(session: dict[str, Any], *, resumable: bool, turn_state: str = "idle",
                 fence: tuple[int, int] = (0, 0), active_response: str | None = None) -> dict[str, Any]:
    """A runner's ``session`` object shaped like vLLM-Omni's ``realtime.session`` (its ``as_public_dict``)."""
    caps = given if isinstance(given := session.get("capabilities"), dict) else {}
    in_format = str(session.get("input_audio_format", "pcm16"))
    out_format = str(session.get("output_audio_format", "pcm16"))
    in_rate = session.get("input_sample_rate", caps.get("input_sample_rate", 16000))
    out_rate = caps.get("output_sample_rate", 24000)
    policy = session.get("overlap_policy")
    epoch, turn_id = fence
    return {
        "object": "realtime.session",
        "type": "realtime",
        "state": "open",
        "turn_state": turn_state,
        "epoch": epoch,
        "turn_id": turn_id,
        "active_request_id": active_response,
        "active_response_id": active_response,
        "active_response_turn_id": turn_id if active_response else None,
        **_OMNI_SESSION_DEFAULTS,
        "playback": {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
        **session,
        "overlap_policy": OMNI_OVERLAP.get(policy, policy) if isinstance(policy, str) else policy,
        "output_modalities": list(session.get("modalities", ["audio", "text"])),
        "sample_rate_hz": in_rate,
        "audio": {
            "input": {"format": {"type": FORMAT_MIME.get(in_format, in_format), "rate": in_rate},
                      "sample_rate_hz": in_rate, "turn_detection": session.get("turn_detection")},
            "output": {"format": {"type": FORMAT_MIME.get(out_format, out_format), "rate": out_rate},
                       "sample_rate_hz": out_rate},
        },
        # vLLM-Omni's unset instructions are null.
        "instructions": session.get("instructions") or None,
        "capabilities": omni_capabilities(caps, resumable=resumable),
    }


class ServerWireEncoder:
    """Encodes one session's server events; keeps the per-response text offsets that marks need."""

    def __init__(self, session_id: str, *, output_format: str = "pcm16", resumable: bool = True,
                 fence: Fence | None = None) -> None:
        """``fence``: the session's current (epoch, turn_id) (none: both 0)."""
        self.session_id = session_id
        self.output_format = output_format
        self.resumable = resumable
        self.turn_state = "idle"
        self._fence = fence or (lambda: (0, 0))
        self._text_chars: dict[str, int] = {}  # response -> transcript characters its audio has spoken so far
        self._items: dict[str, str] = {}  # response -> its assistant item (the newest few)
        #: The newest response and whether it is still running, as the client has been told.
        self.last_response: str | None = None
        self.response_active = False
        self._transcripts: dict[str, str] = {}  # response -> its finished transcript, until its response.done
        self._output_rate = 24000  # the latest audio delta's rate

    def encode(self, event: p.ServerEvent) -> dict[str, Any]:
        if _is_call_response(event):
            # A function call's response is announced whole: it moves neither the turn nor the reply in progress.
            data = codec.encode_event(event, audio_format=self.output_format)
            data["event_id"] = f"event_{uuid.uuid4().hex[:20]}"
            self._call_response(event, data)
            return data
        self.turn_state = _TURN_STATES.get(type(event), self.turn_state)
        if isinstance(event, p.ResponseCreated):
            self.last_response, self.response_active = event.response_id, True
            self._items[event.response_id] = event.item_id
            if len(self._items) > 64:
                del self._items[next(iter(self._items))]
        elif isinstance(event, p.ResponseDone) and event.response_id == self.last_response:
            self.response_active = False
        elif isinstance(event, p.ResponseTranscriptDone):
            self._transcripts[event.response_id] = event.transcript
        elif isinstance(event, p.ResponseAudioDelta):
            self._output_rate = event.sample_rate
        data = codec.encode_event(event, audio_format=self.output_format)
        data["event_id"] = f"event_{uuid.uuid4().hex[:20]}"
        shape = _SHAPES.get(type(event))
        if shape is not None:
            shape(self, event, data)
        return data

    # ---- shapes ----

    def _session(self, event: p.SessionCreated | p.SessionUpdated, data: dict[str, Any]) -> None:
        self.output_format = str(event.session.get("output_audio_format", self.output_format))
        data["session"] = omni_session(event.session, resumable=self.resumable, turn_state=self.turn_state,
                                       fence=self._fence(),
                                       active_response=self.last_response if self.response_active else None)

    def _error(self, event: p.ErrorEvent, data: dict[str, Any]) -> None:
        error = event.error
        data["error"] = omni_error(str(error.get("code")), str(error.get("message", "")),
                                   event_id=error.get("event_id"), param=error.get("param"))

    def _call_response(self, event: p.ResponseCreated | p.ResponseDone, data: dict[str, Any]) -> None:
        """vLLM-Omni's response for a function call (``_function_call_done_events``): the call is its only output,
        and its ``status_details`` say completed from the start."""
        assert event.function_call is not None
        done = isinstance(event, p.ResponseDone)
        data["response"] = {"id": event.response_id, "object": "realtime.response",
                            "status": "completed" if done else "in_progress",
                            "status_details": {"type": "completed", "reason": "completed"},
                            "output": [dict(event.function_call)] if done else [], "metadata": {}}

    def _response(self, event: p.ResponseCreated | p.ResponseDone, data: dict[str, Any]) -> None:
        data.pop("function_call", None)  # ours, and only for a call's response
        if isinstance(event, p.ResponseCreated):
            status, details, output = "in_progress", None, []
            metadata: dict[str, Any] = {"duplex_event": {"type": event.type, "session_id": self.session_id,
                                                         "response_id": event.response_id,
                                                         "epoch": self._fence()[0],
                                                         "modalities": ["audio", "text"]}}
        else:
            status = event.status
            default = {"completed": "stop", "cancelled": "client_cancelled"}.get(status, status)
            details = {"type": status, "reason": event.reason or default}
            output = [{"id": f"item_{event.response_id}", "object": "realtime.item", "type": "message",
                       "role": "assistant", "status": status}]
            sent = round(event.audio_ms)
            metadata = {"type": event.type, "session_id": self.session_id, "response_id": event.response_id,
                        "epoch": self._fence()[0], "model_speak": True, "end_of_turn": True,
                        "text": self._transcripts.pop(event.response_id, ""), "format": self.output_format,
                        "sample_rate_hz": self._output_rate, "audio_duration_ms": sent,
                        # What was heard arrives later, as playback.ack: nothing is acknowledged yet.
                        "playback": {"generated_ms": sent, "sent_ms": sent, "played_ms": 0, "committed_ms": 0}}
            self._text_chars.pop(event.response_id, None)
        data["response"] = {"id": event.response_id, "object": "realtime.response", "status": status,
                            "status_details": details, "output": output, "modalities": ["audio", "text"],
                            "metadata": metadata}

    def _listen(self, event: p.ResponseListen, data: dict[str, Any]) -> None:
        data["session_id"] = self.session_id
        data["response"] = {"id": event.response_id, "object": "realtime.response", "status": "listening",
                            "metadata": {"type": event.type, "session_id": self.session_id,
                                         "reason": event.reason or "model_listen"}}

    def _content(self, event: Any, data: dict[str, Any]) -> None:
        data["output_index"] = 0
        data["content_index"] = 0

    def _transcript_delta(self, event: p.ResponseTranscriptDelta, data: dict[str, Any]) -> None:
        self._content(event, data)
        data["metadata"] = {"session_id": self.session_id, "epoch": self._fence()[0], "model_speak": True}

    def _speak(self, event: p.ResponseSpeak, data: dict[str, Any]) -> None:
        self._content(event, data)
        data["item_id"] = self._items.get(event.response_id, f"item_{event.response_id}")
        data["metadata"] = {"session_id": self.session_id, "epoch": self._fence()[0], "model_speak": True}

    def _committed(self, event: p.InputAudioBufferCommitted, data: dict[str, Any]) -> None:
        epoch, turn_id = self._fence()
        data["event"] = {"type": "input.committed", "session_id": self.session_id, "turn_id": turn_id,
                         "epoch": epoch, "history_len": event.history_len, "native_audio": True,
                         "message": {"role": "user", "content": [{"type": "audio_url",
                                                                  "audio_url": {"url": "native-duplex:input-audio"}}]},
                         "realtime_item_id": event.item_id}

    def _transcribed(self, event: p.InputTranscriptionCompleted, data: dict[str, Any]) -> None:
        data["content_index"] = 0

    def _audio(self, event: p.ResponseAudioDelta, data: dict[str, Any]) -> None:
        self._content(event, data)
        data["sample_rate_hz"] = event.sample_rate
        chars = self._text_chars.get(event.response_id, 0)
        marks = []
        for mark in event.marks:
            # Transcript characters spoken by the end of this mark (words joined by single spaces).
            chars += len(str(mark["text"])) + (1 if chars else 0)
            marks.append({"text_chars": chars, "audio_end_ms": round(float(mark["end_ms"]))})
        self._text_chars[event.response_id] = chars
        end_ms = event.audio_start_ms + event.audio_ms
        data["metadata"] = {"session_id": self.session_id, "epoch": self._fence()[0], "model_speak": True,
                            "end_of_turn": False,
                            "audio_duration_ms": round(end_ms), "audio_text_marks": marks,
                            "playback": {"generated_ms": round(end_ms), "sent_ms": round(end_ms), "played_ms": 0,
                                         "committed_ms": 0}}

    def _closed(self, event: p.SessionClosed, data: dict[str, Any]) -> None:
        data["session_id"] = self.session_id
        data["event"] = {"type": event.type, "reason": event.reason}

    def _acknowledged(self, event: p.PlaybackAcknowledged, data: dict[str, Any]) -> None:
        data["event"] = {"type": event.type, "session_id": self.session_id, "epoch": self._fence()[0],
                         "item_id": event.item_id,
                         "response_id": event.response_id, "played_ms": event.played_ms,
                         "committed_ms": event.playback.get("committed_ms", event.played_ms),
                         "truncate": event.truncate, "playback": event.playback,
                         "history_committed": event.truncate}

    def _turn(self, event: p.TurnEvent, data: dict[str, Any]) -> None:
        data["session_id"] = self.session_id
        data["epoch"] = self._fence()[0]

    def _echo(self, event: Any, data: dict[str, Any]) -> None:
        data["event"] = {k: v for k, v in data.items() if k not in ("event_id", "event")}


def _is_call_response(event: p.ServerEvent) -> TypeGuard[p.ResponseCreated | p.ResponseDone]:
    return isinstance(event, p.ResponseCreated | p.ResponseDone) and event.function_call is not None


_SHAPES: dict[type[p.ServerEvent], Any] = {
    p.SessionCreated: ServerWireEncoder._session,
    p.SessionUpdated: ServerWireEncoder._session,
    p.ErrorEvent: ServerWireEncoder._error,
    p.ResponseCreated: ServerWireEncoder._response,
    p.ResponseDone: ServerWireEncoder._response,
    p.ResponseListen: ServerWireEncoder._listen,
    p.ResponseSpeak: ServerWireEncoder._speak,
    p.InputAudioBufferCommitted: ServerWireEncoder._committed,
    p.InputTranscriptionCompleted: ServerWireEncoder._transcribed,
    p.ResponseAudioDelta: ServerWireEncoder._audio,
    p.ResponseAudioDone: ServerWireEncoder._content,
    p.ResponseTranscriptDelta: ServerWireEncoder._transcript_delta,
    p.ResponseTranscriptDone: ServerWireEncoder._content,
    p.SessionClosed: ServerWireEncoder._closed,
    p.PlaybackAcknowledged: ServerWireEncoder._acknowledged,
    p.TurnEvent: ServerWireEncoder._turn,
    p.ConversationItemTruncated: ServerWireEncoder._echo,
    p.ConversationItemDeleted: ServerWireEncoder._echo,
}
