"""Fixtures: the real vLLM-Omni peer, and ``duplex-agent serve`` in front of it or on its own.

The peer needs ``.venv-omni`` (``make omni-venv``; ``make test`` builds it). When it is missing
the first test that needs it builds it, and skips with the reason if that fails. Peers and
servers are started once per module, and peers once for this folder's tests for each set of options:
a peer's start imports vLLM, seconds of CPU that the lane's real-time tests would otherwise share.
They stop when this folder's tests are done: an idle vLLM-Omni server still polls for engine output
every millisecond, CPU the lane's later tests need. Each test opens its own sessions on them,
so a shared peer's record holds other modules' sessions too, and a test reads only its own lines of it.
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


class Peers:
    """This folder's vLLM-Omni peers, one per set of options, each started on first use.

    Every one has room for ``MAX_SESSIONS``: a session whose socket was only dropped stays for the
    peer's resume grace, and modules come one after another on the same peer."""

    MAX_SESSIONS = 16

    def __init__(self, folder) -> None:
        self.folder = folder
        self.started: dict[tuple, OmniPeer] = {}

    def __call__(self, **options) -> OmniPeer:
        key = tuple(sorted(options.items()))
        if key not in self.started:
            peer = OmniPeer(free_port(), self.folder / f"omni-peer{len(self.started)}.log",
                            max_sessions=self.MAX_SESSIONS, **options)
            self.started[key] = peer
            peer.start()
            peer.ready(PEER_START_TIMEOUT_S)
        return self.started[key]

    def stop(self) -> None:
        for peer in self.started.values():
            peer.stop()
        for key, peer in self.started.items():
            print(f"--- {peer.log_path.name} {dict(key)} (tail) ---\n{peer.log()[-3000:]}")


@pytest.fixture(scope="package")
def omni_peers(omni_python, tmp_path_factory) -> Iterator[Peers]:
    """omni_peers(**options) -> this folder's peer with those options (``OmniPeer``'s, but max_sessions)."""
    peers = Peers(tmp_path_factory.mktemp("omni-peers"))
    yield peers
    peers.stop()


class Started:
    """The ``duplex-agent serve`` processes a module started, stopped in reverse order; their log
    tails go to the report."""

    def __init__(self, folder) -> None:
        self.folder = folder
        self.processes: list[ServeProcess] = []

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
            _blocking(process.stop())
        for process in self.processes:
            print(f"--- {process.log_path.name} (tail) ---\n{process.log()[-3000:]}")


@pytest.fixture(scope="module")
def started(omni_python, tmp_path_factory) -> Iterator[Started]:
    processes = Started(tmp_path_factory.mktemp("serve"))
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
