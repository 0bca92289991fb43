"""Fixtures: the real vLLM-Omni peer, and ``duplex-agent serve`` in front of it or on its own.

The peer needs ``.venv-omni`` (``make omni-venv``; ``make test`` builds it). When it is missing
the first test that needs it builds it, and skips with the reason if that fails. Peers and
servers are started once per module (the peer takes a minute to import vLLM); each test opens
its own sessions on them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from tests.omni_peer.processes import (
    OMNI_PYTHON,
    PEER_START_TIMEOUT_S,
    REPO,
    SERVE_START_TIMEOUT_S,
    OmniPeer,
    OurServe,
    Process,
    free_port,
)

_BUILD_TIMEOUT_S = 1800


@pytest.fixture(scope="session")
def omni_python() -> str:
    if not OMNI_PYTHON.exists():
        try:
            build = subprocess.run(["make", "omni-venv"], cwd=REPO, capture_output=True, text=True,
                                   timeout=_BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f".venv-omni is missing and `make omni-venv` could not run: {exc}")
        if build.returncode != 0 or not OMNI_PYTHON.exists():
            pytest.skip(f".venv-omni is missing and `make omni-venv` failed: {build.stderr[-800:]}")
    return str(OMNI_PYTHON)


class Started:
    """The processes a module started, stopped in reverse order; their log tails go to the report."""

    def __init__(self, folder) -> None:
        self.folder = folder
        self.processes: list[Process] = []

    def peer(self, **options) -> OmniPeer:
        return self._start(OmniPeer(free_port(), self.folder / f"omni-peer{len(self.processes)}.log", **options),
                           PEER_START_TIMEOUT_S)

    def serve(self, **options) -> OurServe:
        return self._start(OurServe(free_port(), self.folder / f"serve{len(self.processes)}.log", **options),
                           SERVE_START_TIMEOUT_S)

    def _start(self, process, timeout):
        self.processes.append(process)
        process.start()
        process.ready(timeout)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        for process in self.processes:
            print(f"--- {process.log_path.name} (tail) ---\n{process.log()[-3000:]}")


@pytest.fixture(scope="module")
def started(omni_python, tmp_path_factory) -> Iterator[Started]:
    processes = Started(tmp_path_factory.mktemp("omni-peer"))
    yield processes
    processes.stop()


@pytest.fixture
def run_duplex_client(omni_python) -> Callable:
    """run_duplex_client(url, *args) -> the report of vLLM-Omni's DuplexClient (devtools.omni_peer.duplex_client_run)."""
    import asyncio
    import json

    async def run(url: str, *args: str, timeout: float = 300.0) -> dict:
        process = await asyncio.create_subprocess_exec(
            omni_python, "-m", "devtools.omni_peer.duplex_client_run", url, *args, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"vLLM-Omni's DuplexClient did not finish in {timeout} s") from None
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        assert process.returncode == 0 and lines, f"DuplexClient run failed ({process.returncode}):\n{err.decode()[-3000:]}"
        return json.loads(lines[-1])

    return run
