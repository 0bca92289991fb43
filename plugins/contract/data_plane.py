"""The data plane: a model's raw stage outputs -> duplex events, and the audio encoder it is given.

A model calls a function with a stage output (a dict) that carries the call under ``FUNCTION_CALL``:
``{"call_id": str, "name": str, "arguments": str}`` (the arguments as JSON text; a call without an
id gets one from the runner). Its data plane projects that as one ``FUNCTION_CALL_DONE`` event
(vLLM-Omni's internal ``function_call.done``), which the runner announces as a response of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping

#: The stage-output key of a model's function call.
FUNCTION_CALL = "function_call"
#: The projected event of a function call: ``{"type": FUNCTION_CALL_DONE, "call_id", "name", "arguments"}``.
FUNCTION_CALL_DONE = "function_call.done"


class DuplexDataPlane(ABC):
    """Turns one model's raw stage outputs into duplex event dicts."""

    @abstractmethod
    def begin_request(self, request_id: str) -> None: ...

    @abstractmethod
    def is_terminal(self, request_id: str | None) -> bool: ...

    @abstractmethod
    def mark_terminal(self, request_id: str) -> None: ...

    @abstractmethod
    def close_stream(self, request_id: str) -> None: ...

    @abstractmethod
    def close_session(self, session_id: str, *, active_request_id: str | None = None) -> None: ...

    @abstractmethod
    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]: ...


#: (audio, sample_rate, response_format, speed) -> the encoded chunk, or None to drop it. The runtime
#: decides the encoding; ours keeps float32 numpy inside the process.
EncodeAudio = Callable[[object, int, str, "float | None"], object]


def project_function_call(output: object) -> list[dict[str, object]]:
    """The ``FUNCTION_CALL_DONE`` event a stage output carries, or none (for a data plane's ``project``)."""
    call = output.get(FUNCTION_CALL) if isinstance(output, Mapping) else None
    if not isinstance(call, Mapping):
        return []
    return [{"type": FUNCTION_CALL_DONE, "call_id": call.get("call_id"), "name": call.get("name"),
             "arguments": call.get("arguments")}]
