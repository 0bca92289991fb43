"""The worker's Prometheus metrics, served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_MS = (10, 20, 40, 60, 80, 100, 150, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000, 5000)

REGISTRY = CollectorRegistry()
ACTIVE_SESSIONS = Gauge("duplex_sessions_active", "Conversations open now", ["transport"], registry=REGISTRY)
SESSIONS_TOTAL = Counter("duplex_sessions", "Conversations opened", ["transport"], registry=REGISTRY)
TURN_LATENCY_MS = Histogram(
    "duplex_turn_latency_ms", "End of caller speech to first agent audio, ms", buckets=_LATENCY_BUCKETS_MS, registry=REGISTRY
)
BARGE_IN_LATENCY_MS = Histogram(
    "duplex_barge_in_latency_ms", "Caller speech onset at input to first silent output frame, ms",
    buckets=_LATENCY_BUCKETS_MS, registry=REGISTRY,
)
PLAYOUT_UNDERRUNS = Counter("duplex_playout_underruns", "Output frames that had to be silence mid-response", registry=REGISTRY)
FRAME_OVERRUNS = Counter("duplex_frame_overruns", "Batched model steps that finished after their frame was due",
                         registry=REGISTRY)
ERRORS = Counter("duplex_errors", "Error events sent to clients", ["code"], registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)
