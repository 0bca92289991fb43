"""The worker's figures: what each one measures (one place for the page, /metrics and logs),
and its Prometheus metrics, served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: Every latency figure a person reads, by name: what it measures, from where to where.
#: The page shows these as tooltips, /metrics as help text, and logs name the figure.
FIGURE_DEFINITIONS: dict[str, str] = {
    "turn_ms": (
        "Turn latency: from the end of the caller's speech (the VAD's audio_end_ms, taken at the "
        "moment that audio reached the worker) to the first frame of the reply played out. It "
        "includes the end-of-turn wait (silence window or end-of-turn model), recognition, the "
        "reply and speech synthesis; not the network or the caller's jitter buffer."
    ),
    "barge_in_ms": (
        "Barge-in latency: from the caller's speech onset reaching the worker to the first "
        "silent frame the worker sends instead of the agent's voice."
    ),
    "input_added_ms": (
        "Input added: from a caller frame reaching the worker to its audio being handed to the "
        "conversation (resampling, chunking and work time)."
    ),
    "output_added_ms": (
        "Output added: from the first audio of a reply arriving from the model to its first "
        "frame played out (resampling and the playout queue)."
    ),
}

_LATENCY_BUCKETS_MS = (10, 20, 40, 60, 80, 100, 150, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000, 5000)

REGISTRY = CollectorRegistry()
ACTIVE_SESSIONS = Gauge("duplex_sessions_active", "Conversations open now", ["transport"], registry=REGISTRY)
SESSIONS_TOTAL = Counter("duplex_sessions", "Conversations opened", ["transport"], registry=REGISTRY)
TURN_LATENCY_MS = Histogram(
    "duplex_turn_latency_ms", FIGURE_DEFINITIONS["turn_ms"] + " In ms.", buckets=_LATENCY_BUCKETS_MS,
    registry=REGISTRY,
)
BARGE_IN_LATENCY_MS = Histogram(
    "duplex_barge_in_latency_ms", FIGURE_DEFINITIONS["barge_in_ms"] + " In ms.",
    buckets=_LATENCY_BUCKETS_MS, registry=REGISTRY,
)
PLAYOUT_UNDERRUNS = Counter("duplex_playout_underruns", "Output frames that had to be silence mid-response", registry=REGISTRY)
FRAME_OVERRUNS = Counter("duplex_frame_overruns", "Batched model steps that finished after their frame was due",
                         registry=REGISTRY)
ERRORS = Counter("duplex_errors", "Error events sent to clients", ["code"], registry=REGISTRY)
END_OF_TURN_INFERENCES = Counter(
    "duplex_end_of_turn_inferences", "Pauses shown to the end-of-turn model (one inference each: its CPU cost)",
    registry=REGISTRY,
)
END_OF_TURN_CPU_SECONDS = Counter(
    "duplex_end_of_turn_cpu_seconds",
    "CPU time of the end-of-turn model's inferences, on its inference thread (all of it with EOT_PARALLELISM=none, "
    "the worker's default)",
    registry=REGISTRY,
)
END_OF_TURN_CONFIDENT = Counter(
    "duplex_end_of_turn_confident",
    "Pauses the end-of-turn model judged the end of the turn (it ends after the short window unless speech resumes)",
    registry=REGISTRY,
)

#: One remote backend of a pool, by its URL (``--backend``).
BACKEND_SESSIONS = Gauge("duplex_backend_sessions", "Conversations this worker holds open on the backend",
                         ["backend"], registry=REGISTRY)
BACKEND_FREE = Gauge("duplex_backend_free_sessions", "Sessions the backend will still take, as this worker "
                     "knows it (-1: unknown)", ["backend"], registry=REGISTRY)
BACKEND_REFUSALS = Counter("duplex_backend_refusals", "Conversations the backend refused (full)", ["backend"],
                           registry=REGISTRY)
BACKEND_FAILURES = Counter("duplex_backend_failures", "Opens that failed (unreachable, timeout) and conversations "
                           "lost with the backend", ["backend"], registry=REGISTRY)
BACKEND_RTT_MS = Gauge("duplex_backend_rtt_ms", "Round trip of the last health probe of the backend, in ms",
                       ["backend"], registry=REGISTRY)
BACKEND_FAILOVERS = Counter("duplex_backend_failovers", "Conversations moved to another backend after theirs "
                            "was lost", registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)
