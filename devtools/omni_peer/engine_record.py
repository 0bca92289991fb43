"""What the scripted engine cores did, one JSON line each: the peer's side of a test.

``python -m devtools.omni_peer --record FILE`` writes, per stage request, a ``started`` line (the
thinker's with the conversation it was prompted with, as the chat template rendered it), then
``finished`` when it produced its last output or ``aborted`` when vLLM-Omni aborted it while it
was still generating. Tests read the file with ``read_record``; nothing here changes what the
scripted stages do. Pure Python: both venvs import it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class EngineRecord:
    """Appends one line per engine event to ``path`` (None: records nothing)."""

    def __init__(self, path: str | None) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (open for the process's life)

    def write(self, stage: str, request_id: str, event: str, **fields: Any) -> None:
        if self._file is not None:
            line = {"t": time.time(), "stage": stage, "request_id": request_id, "event": event, **fields}
            self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_record(path: Path) -> list[dict[str, Any]]:
    """The lines written so far (a line still being written is left for the next read)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines if line]
