"""A data plane for models whose final stage speaks text: audio chunks with their words.

A final-stage output ``{"audio": float32 samples, "text": str}`` becomes an audio delta
(encoded by the runtime's encoder at ``sample_rate``, its text as a mark spanning the chunk) and a transcript delta.
An output carrying a function call (``contract.FUNCTION_CALL``) becomes its ``function_call.done`` event.

One data plane serves every session of a plugin, and sessions may live on different
threads (LiveKit jobs): terminal requests are kept per session, under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from duplex_agent.plugins.contract import DuplexDataPlane, EncodeAudio, project_function_call
from duplex_agent.plugins.contract.engine import StageOutput, request_session_id


class SpeechDataPlane(DuplexDataPlane):
    def __init__(self, encode_audio: EncodeAudio, *, sample_rate: int,
                 on_session_closed: Callable[[str], object] | None = None) -> None:
        self._encode = encode_audio
        self._sample_rate = sample_rate
        self._on_session_closed = on_session_closed
        self._terminal: dict[str, set[str]] = {}  # session id -> its finished requests
        self._lock = threading.Lock()

    def begin_request(self, request_id: str) -> None:
        self.close_stream(request_id)

    def is_terminal(self, request_id: str | None) -> bool:
        if request_id is None:
            return False
        with self._lock:
            return request_id in self._terminal.get(request_session_id(request_id), ())

    def mark_terminal(self, request_id: str) -> None:
        with self._lock:
            self._terminal.setdefault(request_session_id(request_id), set()).add(request_id)

    def close_stream(self, request_id: str) -> None:
        session_id = request_session_id(request_id)
        with self._lock:
            requests = self._terminal.get(session_id)
            if requests is not None:
                requests.discard(request_id)
                if not requests:
                    del self._terminal[session_id]

    @property
    def terminal_request_count(self) -> int:
        with self._lock:
            return sum(len(requests) for requests in self._terminal.values())

    def close_session(self, session_id: str, *, active_request_id: str | None = None) -> None:
        with self._lock:
            self._terminal.pop(session_id, None)
        if self._on_session_closed is not None:
            self._on_session_closed(session_id)

    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
        assert isinstance(result, StageOutput)
        if result.finished:
            self.mark_terminal(result.request_id)
        output = result.output
        calls = project_function_call(output)
        if not isinstance(output, dict) or "audio" not in output:
            return calls
        audio = output["audio"]
        rate = int(output.get("sample_rate", self._sample_rate))
        audio_ms = 1000.0 * len(audio) / rate
        text = str(output.get("text", ""))
        return [
            *calls,
            {"type": "response.output_audio.delta", "delta": self._encode(audio, rate, "pcm16", None),
             "sample_rate": rate, "audio_ms": audio_ms,
             "marks": [{"text": text, "start_ms": 0.0, "end_ms": audio_ms}]},
            {"type": "response.output_audio_transcript.delta", "delta": text + " "},
        ]
