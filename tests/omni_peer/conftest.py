"""Fixtures: the real vLLM-Omni peer, and ``duplex-agent serve`` in front of it or on its own.

The peer needs ``.venv-omni`` (``make omni-venv``; ``make test`` builds it). When it is missing
the first test that needs it builds it, and skips with the reason if that fails. Peers and
servers are started once per module (the peer takes a minute to import vLLM); each test opens
its own sessions on them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.omni_peer.processes import OMNI_PYTHON, PEER_START_TIMEOUT_S, REPO, OmniPeer, free_port
from tests.serve_process import ServeProcess

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


def _blocking(coroutine: Coroutine):
    """``coroutine``'s result, run on a loop of its own: module fixtures start processes outside the
    tests' loops, and the tests' own calls to them block their loop anyway while a process starts."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


class Started:
    """The processes a module started, stopped in reverse order; their log tails go to the report."""

    def __init__(self, folder) -> None:
        self.folder = folder
        self.processes: list[OmniPeer | ServeProcess] = []

    def peer(self, **options) -> OmniPeer:
        peer = OmniPeer(free_port(), self.folder / f"omni-peer{len(self.processes)}.log", **options)
        self.processes.append(peer)
        peer.start()
        peer.ready(PEER_START_TIMEOUT_S)
        return peer

    def serve(self, *, plugin: str = "scripted", backend: str | None = None,
              extra: list[str] | None = None) -> ServeProcess:
        """``duplex-agent serve``: with ``plugin`` a model of its own, with ``backend`` a remote one."""
        args = ["--backend", backend] if backend else ["--plugin", plugin]
        serve = ServeProcess(self.folder / f"serve{len(self.processes)}.log", *args, *(extra or ()))
        self.processes.append(serve)
        serve.start()
        _blocking(serve.ready())
        return serve

    def stop(self) -> None:
        for process in reversed(self.processes):
            if isinstance(process, ServeProcess):
                _blocking(process.stop())
            else:
                process.stop()
        for process in self.processes:
            print(f"--- {process.log_path.name} (tail) ---\n{process.log()[-3000:]}")


@pytest.fixture(scope="module")
def started(omni_python, tmp_path_factory) -> Iterator[Started]:
    processes = Started(tmp_path_factory.mktemp("omni-peer"))
    yield processes
    processes.stop()


@pytest.fixture(scope="session")
def run_duplex_client(omni_python) -> Callable[[list[tuple[str, int | str]]], list[dict]]:
    """run_duplex_client([(url, drop), ...]) -> the reports of vLLM-Omni's DuplexClient, one per run, in order
    (``drop``: see ``devtools.omni_peer.duplex_client_run``).

    The runs go side by side in one process (``devtools.omni_peer.duplex_client_run``), a session
    each: the import of vLLM-Omni is most of a run's time.
    """
    def run(runs: list[tuple[str, int | str]], timeout: float = 600.0) -> list[dict]:
        command = [omni_python, "-m", "devtools.omni_peer.duplex_client_run"]
        for url, drop in runs:
            command += ["--run", url, str(drop)]
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"vLLM-Omni's DuplexClient runs did not finish in {timeout} s") from None
        reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0 and len(reports) == len(runs), \
            f"DuplexClient runs failed ({done.returncode}, {len(reports)} of {len(runs)} reports):\n{done.stderr[-3000:]}"
        return reports

    return run
