"""The options the LiveKit worker gives livekit-agents (no server needed: nothing connects)."""

from livekit.agents.telemetry.loop_monitor import LoopMonitorThresholds

from duplex_agent.agent.app.livekit_worker import LOOP_BLOCK_WARN_ENV, LiveCalls, build_agent_server
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.session.ports import DuplexBackend

SETTINGS = Settings(livekit_url="ws://127.0.0.1:7880", livekit_api_key="key", livekit_api_secret="secret" * 6)


class IdleBackend(DuplexBackend):
    active_sessions = 0


def test_job_loops_are_watched_for_blocks_of_250_ms_unless_the_deployment_says(monkeypatch):
    monkeypatch.setenv(LOOP_BLOCK_WARN_ENV, "unset below")  # so that the test's end restores the real state
    monkeypatch.delenv(LOOP_BLOCK_WARN_ENV)
    build_agent_server(SETTINGS, IdleBackend(), LiveCalls(), dev=False)
    thresholds = LoopMonitorThresholds.from_env()
    assert thresholds is not None and thresholds.warn == 0.25  # a heartbeat every 50 ms, not 20

    monkeypatch.setenv(LOOP_BLOCK_WARN_ENV, "80")
    build_agent_server(SETTINGS, IdleBackend(), LiveCalls(), dev=False)
    assert LoopMonitorThresholds.from_env().warn == 0.08
    monkeypatch.setenv(LOOP_BLOCK_WARN_ENV, "0")
    build_agent_server(SETTINGS, IdleBackend(), LiveCalls(), dev=False)
    assert LoopMonitorThresholds.from_env() is None  # off, as livekit-agents allows
