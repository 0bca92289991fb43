"""The real vLLM-Omni peer (in .venv-omni) as a subprocess; ``duplex-agent serve`` is tests.serve_process's.

The peer has its log in a file, is waited on by its own health route (never by a sleep), and is
stopped by SIGTERM (SIGKILL only past a generous deadline).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from devtools.omni_peer.engine_record import read_record
from tests.serve_process import REPO, STOP_TIMEOUT_S, environment, free_port  # noqa: F401 (free_port: for users)

OMNI_PYTHON = REPO / ".venv-omni" / "bin" / "python"
#: The peer imports vLLM and vLLM-Omni (about 40 s on an idle core); the loaded CI machine gets more.
PEER_START_TIMEOUT_S = 300.0
#: Words in the scripted replies the modules' peers say, so that modules share peers: short ones,
#: and long ones (4.8 s) during which the peer is still generating when a caller talks over them.
SHORT_WORDS = 3
LONG_WORDS = 16


def _environment() -> dict[str, str]:
    """The tests' environment without this venv's own (the peer runs in .venv-omni)."""
    return {k: v for k, v in environment().items() if not k.startswith("VIRTUAL_ENV")}


class Process:
    """One subprocess with its log in a file."""

    health_path = "/"

    def __init__(self, argv: list[str], port: int, log_path: Path) -> None:
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(self.argv, cwd=REPO, env=_environment(), stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> tuple[int, dict] | None:
        url = f"http://127.0.0.1:{self.port}{self.health_path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as refused:
            return refused.code, {}
        except (OSError, ValueError):
            return None

    def ready(self, timeout: float) -> None:
        """Block until the health route answers 200 (module fixtures start processes before the tests' loops)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.health()
            if answer is not None and answer[0] == 200:
                return
            assert self.process is not None and self.process.poll() is None, \
                f"{self.argv[2:4]} exited ({self.process.returncode}):\n{self.log()[-4000:]}"
            assert time.monotonic() < deadline, f"{self.argv[2:4]} not healthy after {timeout} s:\n{self.log()[-4000:]}"
            time.sleep(0.25)

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._log is not None:
            self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL now, as a crashed host would go."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()


class OmniPeer(Process):
    """vLLM-Omni 0.30.0's duplex server with scripted stages (devtools.omni_peer)."""

    health_path = "/health"

    def __init__(self, port: int, log_path: Path, *, sample_rate: int = 24000, text_only: bool = False,
                 words: int = 3, disconnect_grace_s: float = 30.0, max_sessions: int = 4, tools: bool = False,
                 calls_per_reply: int = 1) -> None:
        """``tools``: the model calls the session's tools (devtools.omni_peer.scripted_calls)."""
        argv = [str(OMNI_PYTHON), "-m", "devtools.omni_peer", "--port", str(port), "--sample-rate",
                str(sample_rate), "--words", str(words), "--disconnect-grace", str(disconnect_grace_s),
                "--max-sessions", str(max_sessions), "--calls-per-reply", str(calls_per_reply)]
        if text_only:
            argv.append("--text-only")
        if tools:
            argv.append("--tools")
        self.record_path = log_path.with_suffix(".record.jsonl")
        super().__init__(argv + ["--record", str(self.record_path)], port, log_path)

    def record(self) -> list[dict]:
        """What its scripted engine cores did so far (devtools.omni_peer.engine_record)."""
        return read_record(self.record_path)

    @property
    def realtime_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?duplex=1"
