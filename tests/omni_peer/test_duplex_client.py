"""vLLM-Omni's own DuplexClient (0.30.0, run in .venv-omni) against our server, and against the real one.

The real server is the control: the same client run must pass there, so a failure against ours
is ours. Each run: two turns (stream, commit with a response, drain the audio, acknowledge
playback), the TCP connection aborted after the first, the client's own resume, the second turn.
"""

from __future__ import annotations

import pytest

_DROPS = {"whole": 0, "dropped": 1}  # after which turn the connection is aborted (0: never)


@pytest.fixture(scope="module")
def reports(started, run_duplex_client) -> dict[tuple[str, str], dict]:
    """(server, connection) -> the client's report: every run in one client process, one after another."""
    servers = {"ours": started.serve(plugin="scripted"), "vllm-omni": started.peer()}
    runs = [(server, connection) for server in servers for connection in _DROPS]
    done = run_duplex_client([(servers[server].realtime_url, _DROPS[connection]) for server, connection in runs])
    return dict(zip(runs, done))


def _check_report(report: dict) -> None:
    assert "failure" not in report, report
    assert report["errors"] == [], report
    assert len(report["turns"]) == 2, report
    for turn in report["turns"]:
        assert turn["decision"] == "speak" and turn["transcript"].strip(), report
        assert turn["audio_bytes"] > 0 and turn["played_ms"] > 0, report
        assert turn["done_type"] == "response.done" and turn["status"] == "completed", report
    assert report["turns"][0]["response_id"] != report["turns"][1]["response_id"], report


@pytest.mark.parametrize("server", ["ours", "vllm-omni"])
def test_duplex_client_completes_turns_and_acks(reports, server):
    report = reports[server, "whole"]
    _check_report(report)
    assert report["resumed"] == 0


@pytest.mark.parametrize("server", ["ours", "vllm-omni"])
def test_duplex_client_resumes_a_dropped_connection(reports, server):
    report = reports[server, "dropped"]
    _check_report(report)
    assert report["resumed"] == 1, report
    assert report["session_ids"][0] == report["session_ids"][1], report
