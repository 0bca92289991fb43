"""A data plane for models whose final stage speaks text: audio chunks with their words.

A final-stage output ``{"audio": float32 samples, "text": str}`` becomes an audio delta
(encoded by the runtime's encoder at ``sample_rate``, its text as a mark spanning the chunk) and a transcript delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from duplex_agent.plugins.contract import DuplexDataPlane, EncodeAudio
from duplex_agent.plugins.contract.engine import StageOutput, request_session_id


class SpeechDataPlane(DuplexDataPlane):
    def __init__(self, encode_audio: EncodeAudio, *, sample_rate: int,
                 on_session_closed: Callable[[str], object] | None = None) -> None:
        self._encode = encode_audio
        self._sample_rate = sample_rate
        self._on_session_closed = on_session_closed
        self._terminal: set[str] = set()

    def begin_request(self, request_id: str) -> None:
        self._terminal.discard(request_id)

    def is_terminal(self, request_id: str | None) -> bool:
        return request_id in self._terminal

    def mark_terminal(self, request_id: str) -> None:
        self._terminal.add(request_id)

    def close_stream(self, request_id: str) -> None:
        self._terminal.discard(request_id)

    def close_session(self, session_id: str, *, active_request_id: str | None = None) -> None:
        self._terminal = {r for r in self._terminal if request_session_id(r) != session_id}
        if self._on_session_closed is not None:
            self._on_session_closed(session_id)

    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
        assert isinstance(result, StageOutput)
        if result.finished:
            self.mark_terminal(result.request_id)
        output = result.output
        if not isinstance(output, dict) or "audio" not in output:
            return []
        audio = output["audio"]
        rate = int(output.get("sample_rate", self._sample_rate))
        audio_ms = 1000.0 * len(audio) / rate
        text = str(output.get("text", ""))
        return [
            {"type": "response.output_audio.delta", "delta": self._encode(audio, rate, "pcm16", None),
             "sample_rate": rate, "audio_ms": audio_ms,
             "marks": [{"text": text, "start_ms": 0.0, "end_ms": audio_ms}]},
            {"type": "response.output_audio_transcript.delta", "delta": text + " "},
        ]
