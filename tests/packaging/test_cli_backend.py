"""A bad or unreachable ``--backend`` stops ``serve``, ``start`` and ``dev`` with one line and exit 2
(before: a traceback, exit 1); a pool with one host down still starts and answers calls."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conformance.omni_client import OmniClient
from tests.packaging.import_graph import ROOT
from tests.serve_process import ServeProcess
from tests.support.audio import tone

CLI = [sys.executable, "-m", "duplex_agent.agent.app.cli"]
#: start and dev check these before the backend; no LiveKit server is reached (the backend fails first).
LIVEKIT = {"LIVEKIT_URL": "ws://127.0.0.1:9", "LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "devsecret"}


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """A loopback port that is bound and never listens: every connection is refused, and no one else takes it."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"ws://127.0.0.1:{bound.getsockname()[1]}/v1/realtime?duplex=1"


def run_cli(command: str, backend: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    env.update(LIVEKIT, HF_HUB_OFFLINE="1")
    return subprocess.run([*CLI, command, "--backend", backend], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def the_error(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    (line,) = [text for text in run.stderr.splitlines() if text.startswith("duplex-agent:")]
    return line


CASES = {
    "missing file": ("@{tmp}/no-such-list", "--backend '@{tmp}/no-such-list': cannot read the list of backends: "
                                            "No such file or directory"),
    "only commas": (",", "--backend ',' names no backend (no URL between the commas)"),
    "empty file": ("@{tmp}/empty", "--backend '@{tmp}/empty' names no backend (the file holds no URL)"),
    "not a URL": ("gpu-host:8000", "--backend: 'gpu-host:8000' is not a ws:// or wss:// URL "
                                   "(ws://HOST:PORT/v1/realtime?duplex=1)"),
}


#: Every case through serve; start and dev reach the same check through the LiveKit worker's runner.
COMMAND_CASES = [*(("serve", case) for case in CASES), ("start", "missing file"), ("dev", "only commas")]


@pytest.mark.parametrize("command, case", COMMAND_CASES)
def test_a_backend_setting_that_names_no_backend_is_one_line_and_exit_2(tmp_path, command, case):
    (tmp_path / "empty").write_text("# every host is commented out\n\n")
    backend, reason = (text.format(tmp=tmp_path) for text in CASES[case])
    assert the_error(run_cli(command, backend)) == f"duplex-agent: {reason}"


@pytest.mark.parametrize("command", ["serve", "start", "dev"])
def test_a_single_unreachable_backend_stops_the_worker_with_the_reason(refusing_url, command):
    """The worker learns the model from its backend at start, so with none answering it could take no call."""
    line = the_error(run_cli(command, refusing_url))
    assert line.startswith(f"duplex-agent: --backend: cannot reach the duplex server at {refusing_url}: "), line


def test_a_pool_none_of_whose_backends_answers_says_so(refusing_url):
    second = refusing_url.replace("/v1/", "/v2/")
    line = the_error(run_cli("serve", f"{refusing_url},{second}"))
    assert line.startswith("duplex-agent: --backend: none of the 2 backends answered; the first: cannot reach "
                           f"the duplex server at {refusing_url}: "), line


async def test_a_pool_with_one_host_down_starts_and_answers_on_the_other(tmp_path, refusing_url):
    host = ServeProcess(tmp_path / "host.log", "--plugin", "scripted").start()
    front = ServeProcess(tmp_path / "front.log", "--backend", refusing_url, "--backend", host.realtime_url,
                  "--backend-connect-timeout", "1")
    caller = OmniClient(front.realtime_url)
    try:
        await host.ready()
        await front.start().ready()
        await caller.open({"turn_detection": None})
        await caller.append(tone(300))
        await caller.send({"type": "input_audio_buffer.commit"})
        done, _ = await caller.until("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        assert ((await host.health()) or {}).get("sessions") == 1
        assert f"backend {refusing_url.split('?')[0]} did not start: cannot reach" in front.log()
        # Only session.close ends a session at once: a bare socket close would hold it (and the front's
        # exit on SIGTERM) for the 30 s resume grace.
        await caller.send({"type": "session.close"})
        await caller.until("session.closed")
    finally:
        await caller.close()
        codes = [await serve.stop() for serve in (front, host)]
    assert codes == [0, 0], codes
