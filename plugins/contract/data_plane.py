"""The data plane: a model's raw stage outputs -> duplex events, and the audio encoder it is given."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable


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
