"""vLLM-Omni's own DuplexClient (0.30.0, run in .venv-omni) against our server, and against the real one.

The real server is the control: the same client run must pass there, so a failure against ours
is ours. Each run: two turns (stream, commit with a response, drain the audio, acknowledge
playback), the TCP connection aborted after the first, the client's own resume, the second turn.
Or the connection lost in the middle of the first reply the way a network goes away: the server's
side stays open and silent while the client resumes on a new one, and the reply must go on to its
``response.done`` there. Ours tells a slow story (``StoryPlugin``), so the old socket's buffers
fill long before the reply ends.
"""

from __future__ import annotations

import pytest

#: After which turn the connection is aborted (0: never; silentN: in the middle of turn N's reply).
_DROPS = {"whole": "0", "dropped": "1", "silent": "silent1"}


@pytest.fixture(scope="module")
def reports(started, omni_peers, run_duplex_client) -> dict[tuple[str, str], dict]:
    """(server, connection) -> the client's report: every run in one client process, side by side."""
    servers = {"ours": started.serve(plugin="tests.remote.server_process.StoryPlugin"), "vllm-omni": omni_peers()}
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


@pytest.mark.parametrize("server", ["ours", "vllm-omni"])
def test_duplex_client_resumes_a_connection_lost_mid_reply_and_hears_the_reply_to_its_end(reports, server):
    report = reports[server, "silent"]
    _check_report(report)
    assert report["silenced"] == 1 and report["resumed"] == 1, report
    assert report["session_ids"][0] == report["session_ids"][1], report
    # Nothing lost (the client drops what it saw twice): the reply's audio is an undisturbed run's.
    whole = reports[server, "whole"]
    assert report["turns"][0]["audio_bytes"] == whole["turns"][0]["audio_bytes"], (report, whole)
    assert report["turns"][0]["transcript"] == whole["turns"][0]["transcript"], (report, whole)
