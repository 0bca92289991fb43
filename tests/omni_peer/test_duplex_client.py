"""vLLM-Omni's own DuplexClient (0.30.0, run in .venv-omni) against our server, and against the real one.

The real server is the control: the same client run must pass there, so a failure against ours
is ours. Each run: two turns (stream, commit with a response, drain the audio, acknowledge
playback), the TCP connection aborted after the first, the client's own resume, the second turn.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def servers(started):
    return {"ours": started.serve(plugin="scripted"), "vllm-omni": started.peer()}


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
async def test_duplex_client_completes_turns_and_acks(servers, run_duplex_client, server):
    report = await run_duplex_client(servers[server].realtime_url, "--turns", "2")
    _check_report(report)
    assert report["resumed"] == 0


@pytest.mark.parametrize("server", ["ours", "vllm-omni"])
async def test_duplex_client_resumes_a_dropped_connection(servers, run_duplex_client, server):
    report = await run_duplex_client(servers[server].realtime_url, "--turns", "2", "--drop-after", "1")
    _check_report(report)
    assert report["resumed"] == 1, report
    assert report["session_ids"][0] == report["session_ids"][1], report
