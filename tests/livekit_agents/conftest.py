from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.livekit.conftest import (  # noqa: F401 (fixtures)
    REPO,
    AgentProcess,
    _environment,
    livekit_server,
    processes,
    start_serve,
)

APP = Path(__file__).with_name("app.py")
AGENT_NAME = "duplex-lk-test"  # app.py's


class AppWorker(AgentProcess):
    """``python tests/livekit_agents/app.py start``: a real livekit-agents worker running our DuplexModel."""

    def __init__(self, server, log_path: Path, record: Path, **env: str) -> None:
        super().__init__([], _environment(LIVEKIT_URL=server.url, LIVEKIT_API_KEY=server.api_key,
                                          LIVEKIT_API_SECRET=server.api_secret, DUPLEX_TEST_RECORD=str(record),
                                          PYTHONPATH=str(REPO), **env), log_path)
        self.args = [sys.executable, str(APP), "start"]
        self.record = record

    def report(self) -> str:
        """The log's tail and the records' (where each session's turns got to)."""
        rows = self.record.read_text().splitlines() if self.record.exists() else []
        return super().report() + f"\n--- {self.log_path.name} (ours, warnings and errors, last 40) ---\n" \
            + "\n".join(line[:400] for line in self._notable_lines()[-40:]) \
            + f"\n--- {self.record.name} (last 40) ---\n" + "\n".join(rows[-40:])

    def _notable_lines(self) -> list[str]:
        """Our session's records, warnings and errors, wherever they fell: the tail alone misses a
        turn's early trouble."""
        return [line for line in self.log().splitlines()
                if '"name": "duplex_agent' in line or any(f'"level": "{level}"' in line for level in ("WARNING", "ERROR", "CRITICAL"))]

    def records(self, kind: str | None = None, room: str | None = None) -> list[dict]:
        if not self.record.exists():
            return []
        rows = [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]
        return [r for r in rows if (kind is None or r["kind"] == kind) and (room is None or r["room"] == room)]


@pytest.fixture
def start_app(livekit_server, tmp_path, processes):  # noqa: F811
    async def start(**env: str) -> AppWorker:
        worker = AppWorker(livekit_server, tmp_path / f"app{len(processes)}.log", tmp_path / "record.jsonl", **env)
        processes.append(worker)
        worker.start()
        await livekit_server.wait_for_worker(AGENT_NAME, available=True, timeout=120)
        return worker

    return start
