"""The worker's health and Prometheus endpoints, on the real app (scripted model, loopback)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from duplex_agent import frontend
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.metrics import FIGURE_DEFINITIONS
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from duplex_agent.webrtc.direct.host_address import interface_ipv4

REALTIME = "/v1/realtime?duplex=1"
FAMILIES = {
    "duplex_sessions_active": "gauge",
    "duplex_turn_latency_ms": "histogram",
    "duplex_barge_in_latency_ms": "histogram",
    "duplex_playout_underruns": "counter",
    "duplex_errors": "counter",
}


@pytest.fixture
async def worker():
    """The worker app with the scripted model: (http client, backend)."""
    plugin = ScriptedPlugin(as_float32_audio, Script(reply="fine thanks"))
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=3)
    app = build_app(backend, Settings(ice_address=interface_ipv4(), max_sessions=3))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    yield client, backend
    await client.close()
    await backend.close()


async def _metrics(http: TestClient) -> dict[str, object]:
    response = await http.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    return {family.name: family for family in text_string_to_metric_families(await response.text())}


def _sample(families: dict[str, object], family: str, sample: str, **labels: str) -> float | None:
    for s in families[family].samples:  # type: ignore[attr-defined]
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


async def _health(http: TestClient) -> dict[str, object]:
    response = await http.get("/healthz")
    assert response.status == 200
    assert response.content_type == "application/json"
    return await response.json()


async def _until(condition, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _receive(ws, event_type: str, timeout: float = 5.0) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            event = json.loads((await ws.receive()).data)
            if event["type"] == event_type:
                return event


async def test_healthz_reports_status_and_session_counts(worker):
    http, _ = worker
    health = await _health(http)
    assert health == {"status": "ok", "sessions": 0, "max_sessions": 3}

    async with http.ws_connect(REALTIME) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        await _receive(ws, "session.created")
        health = await _health(http)
        assert health["status"] == "ok" and health["sessions"] == 1 and health["max_sessions"] == 3
        # Only session.close ends a session at once (a closed socket leaves it for a resume, as vLLM-Omni's).
        await ws.send_str(json.dumps({"type": "session.close"}))
        await _receive(ws, "session.closed")

    async def closed() -> bool:
        return (await _health(http))["sessions"] == 0

    await _until(closed)


async def test_metrics_is_prometheus_text_with_the_worker_families(worker):
    http, _ = worker
    families = await _metrics(http)
    for name, kind in FAMILIES.items():
        assert name in families, name
        assert families[name].type == kind, name  # type: ignore[attr-defined]
    for histogram in ("duplex_turn_latency_ms", "duplex_barge_in_latency_ms"):
        assert _sample(families, histogram, histogram + "_count") is not None
        assert _sample(families, histogram, histogram + "_bucket", le="80.0") is not None
    assert _sample(families, "duplex_playout_underruns", "duplex_playout_underruns_total") is not None
    assert _sample(families, "duplex_sessions_active", "duplex_sessions_active", transport="all") == 0

    async with http.ws_connect(REALTIME) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        await _receive(ws, "session.created")
        families = await _metrics(http)
        assert _sample(families, "duplex_sessions_active", "duplex_sessions_active", transport="all") == 1


async def test_a_bad_realtime_input_counts_an_error_with_its_code(worker):
    http, _ = worker
    before = _sample(await _metrics(http), "duplex_errors", "duplex_errors_total", code="invalid_json") or 0.0
    async with http.ws_connect(REALTIME) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        await _receive(ws, "session.created")
        await ws.send_str("not json")
        error = await _receive(ws, "error")
        assert error["error"]["code"] == "invalid_json"
        after = _sample(await _metrics(http), "duplex_errors", "duplex_errors_total", code="invalid_json")
        assert after == before + 1
        # The session serves on after the error.
        await ws.send_str(json.dumps({"type": "input_audio_buffer.clear"}))
        await _receive(ws, "input_audio_buffer.cleared")


async def test_each_figure_is_defined_once_for_metrics_the_page_and_logs(worker):
    """/metrics help text is the same definition the page shows as a tooltip."""
    http, _ = worker
    families = await _metrics(http)
    for family, figure in (("duplex_turn_latency_ms", "turn_ms"), ("duplex_barge_in_latency_ms", "barge_in_ms")):
        assert families[family].documentation == FIGURE_DEFINITIONS[figure] + " In ms."  # type: ignore[attr-defined]
    assert "end of the caller's speech" in FIGURE_DEFINITIONS["turn_ms"]
    page = (Path(frontend.__file__).parent / "index.html").read_text()
    for figure in ("turn_ms", "barge_in_ms"):
        assert f'data-figure="{figure}"' in page
