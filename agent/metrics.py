"""The worker's figures: what each one measures (one place for the page, /metrics and logs),
and its Prometheus metrics, served at ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from duplex_agent.agent.process_figures import ProcessFigures

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
    "false_pause_ms": (
        "False pause: the silence the caller heard in a reply the worker paused at the first window of "
        "their sound and then resumed because the sound did not hold (a cough, a knock, a short "
        "backchannel): from the fade-out's last sample to the fade-in's first."
    ),
    "input_added_ms": (
        "Input added: from a caller frame reaching the worker to its audio being handed to the "
        "conversation (resampling, chunking and work time)."
    ),
    "receive_delay_ms": (
        "Receive buffer delay: from a caller packet's arrival at the worker (direct path) to its 20 ms "
        "frame handed to the call path: the wait for an earlier packet that was late or lost."
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
SESSIONS_REFUSED = Counter("duplex_sessions_refused", "New conversations refused, by code: resource_exhausted "
                           "(every slot taken), overloaded (the machine past --max-cpu), shutting_down",
                           ["transport", "code"], registry=REGISTRY)
MACHINE_CPU_BUSY = Gauge("duplex_machine_cpu_busy", "The machine's CPUs' busy share over the last few seconds, "
                         "as --max-cpu reads it (only with --max-cpu)", registry=REGISTRY)
TURN_LATENCY_MS = Histogram(
    "duplex_turn_latency_ms", FIGURE_DEFINITIONS["turn_ms"] + " In ms.", buckets=_LATENCY_BUCKETS_MS,
    registry=REGISTRY,
)
BARGE_IN_LATENCY_MS = Histogram(
    "duplex_barge_in_latency_ms", FIGURE_DEFINITIONS["barge_in_ms"] + " In ms.",
    buckets=_LATENCY_BUCKETS_MS, registry=REGISTRY,
)
BARGE_IN_PAUSES = Counter(
    "duplex_barge_in_pauses",
    "Agent replies paused at the first sign of caller sound over them: a VAD window (32 ms) or a rise in level (10 ms)",
    registry=REGISTRY,
)
BARGE_IN_LEVEL_PAUSES = Counter(
    "duplex_barge_in_level_pauses",
    "Of the pauses, those a rise in the caller's level made before any VAD window scored the sound",
    registry=REGISTRY,
)
BARGE_IN_FALSE_PAUSES = Counter(
    "duplex_barge_in_false_pauses",
    "Paused replies resumed, nothing skipped, because the caller's sound did not hold as speech",
    registry=REGISTRY,
)
DIAL_OUTCOMES = Counter(
    "duplex_dial_outcomes",
    "Outbound calls placed, by outcome: answered, or why not (busy, declined, no_answer, invalid_number, "
    "unknown_trunk, not_permitted, invalid_request, failed); voicemail: answered by a machine and hung up on; hung_up_during_greeting: answered, then the "
    "far end hung up before the agent's greeting was heard to its end",
    ["outcome"], registry=REGISTRY,
)
AMD_DECISIONS = Counter(
    "duplex_amd_decisions",
    "Answered outbound calls screened for voicemail, by what answered: human or machine",
    ["verdict"], registry=REGISTRY,
)
BARGE_INS_CONFIRMED = Counter(
    "duplex_barge_ins_confirmed", "Caller speech held over the agent (the minimum speech): the reply was cancelled",
    registry=REGISTRY,
)
BARGE_IN_PAUSES_WITHHELD = Counter(
    "duplex_barge_in_pauses_withheld",
    "Onsets over a reply that had its quota of false pauses: not paused (held speech still cancels it)",
    registry=REGISTRY,
)
FALSE_PAUSE_MS = Histogram(
    "duplex_false_pause_ms", FIGURE_DEFINITIONS["false_pause_ms"] + " In ms.", buckets=_LATENCY_BUCKETS_MS,
    registry=REGISTRY,
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

RECEIVE_DELAY_MS = Histogram(
    "duplex_receive_delay_ms", FIGURE_DEFINITIONS["receive_delay_ms"] + " In ms, all calls.",
    buckets=(1, 5, 10, 20, 30, 40, 60, 80, 100, 150, 200, 300), registry=REGISTRY,
)

#: What the direct path's receive buffer counts, per call and in total (``receive_frames``/``receive_packets``).
RECEIVE_FRAME_OUTCOMES = {
    "received": "decoded from their own packet",
    "recovered": "lost, recovered from the next packet's Opus in-band FEC",
    "concealed": "filled by libopus's packet-loss concealment (lost, or not Opus)",
}
RECEIVE_PACKET_EVENTS = {
    "lost": "not there by their frame's deadline",
    "reordered": "came after a later packet, in time to be put in place",
    "late": "came after their frame was filled, dropped",
    "duplicates": "came twice",
    "invalid": "not Opus (garbage or truncated payloads)",
    "ssrc_changes": "the caller's stream changed SSRC",
    "timestamp_jumps": "the RTP timestamp jumped away from where the wall clock puts the stream",
    "sequence_jumps": "the RTP sequence number jumped",
}


class ReceiveBufferFigures:
    """The caller receive buffers of live direct calls (per call) and of all calls (totals).

    A buffer's ``read()`` returns its counts (the keys above) and its delays in ms
    (``delay_ms`` the last frame's, ``delay_p95_ms`` over its last 10 s, ``target_delay_ms``).
    Read when /metrics is rendered, so a packet costs no metric update.
    """

    def __init__(self) -> None:
        self._live: dict[str, Callable[[], Mapping[str, float]]] = {}
        self._ended: dict[str, float] = {}

    def track(self, call: str, read: Callable[[], Mapping[str, float]]) -> None:
        self._live[call] = read

    def forget(self, call: str) -> None:
        read = self._live.pop(call, None)
        if read is not None:
            for key, value in read().items():
                if key in RECEIVE_FRAME_OUTCOMES or key in RECEIVE_PACKET_EVENTS:
                    self._ended[key] = self._ended.get(key, 0) + value

    def collect(self):
        live = {call: dict(read()) for call, read in list(self._live.items())}
        frames = CounterMetricFamily("duplex_receive_frames", "The caller's frames on the direct path, by outcome, "
                                     "all calls: " + "; ".join(f"{k}: {v}" for k, v in RECEIVE_FRAME_OUTCOMES.items()),
                                     labels=["outcome"])
        packets = CounterMetricFamily("duplex_receive_packets", "The caller's RTP packets on the direct path, by "
                                      "event, all calls: " + "; ".join(f"{k}: {v}" for k, v in RECEIVE_PACKET_EVENTS.items()),
                                      labels=["event"])
        call_frames = GaugeMetricFamily("duplex_receive_call_frames", "duplex_receive_frames of one live call",
                                        labels=["call", "outcome"])
        call_packets = GaugeMetricFamily("duplex_receive_call_packets", "duplex_receive_packets of one live call",
                                         labels=["call", "event"])
        call_delay = GaugeMetricFamily(
            "duplex_receive_call_delay_ms", FIGURE_DEFINITIONS["receive_delay_ms"] + " One live call: current (the "
            "last frame's), p95 (its last 10 s) and target (how long a hole waits for its packet).",
            labels=["call", "stat"])
        for family, names in ((frames, RECEIVE_FRAME_OUTCOMES), (packets, RECEIVE_PACKET_EVENTS)):
            for key in names:
                family.add_metric([key], self._ended.get(key, 0) + sum(c.get(key, 0) for c in live.values()))
        for call, counts in live.items():
            for key in RECEIVE_FRAME_OUTCOMES:
                call_frames.add_metric([call, key], counts.get(key, 0))
            for key in RECEIVE_PACKET_EVENTS:
                call_packets.add_metric([call, key], counts.get(key, 0))
            for stat, key in (("current", "delay_ms"), ("p95", "delay_p95_ms"), ("target", "target_delay_ms")):
                call_delay.add_metric([call, stat], counts.get(key, 0.0))
        return [frames, packets, call_frames, call_packets, call_delay]


RECEIVE_BUFFERS = ReceiveBufferFigures()
REGISTRY.register(RECEIVE_BUFFERS)

#: One remote backend of a pool, by its URL (``--backend``).
BACKEND_SESSIONS = Gauge("duplex_backend_sessions", "Conversations this worker holds open on the backend",
                         ["backend"], registry=REGISTRY)
BACKEND_FREE = Gauge("duplex_backend_free_sessions", "Sessions the backend will still take, as this worker "
                     "knows it (-1: unknown)", ["backend"], registry=REGISTRY)
BACKEND_REFUSALS = Counter("duplex_backend_refusals", "Conversations the backend refused (full)", ["backend"],
                           registry=REGISTRY)
BACKEND_FAILURES = Counter("duplex_backend_failures", "Opens that failed and conversations lost with the backend, "
                           "by why (the error code: backend_timeout, backend_unavailable, backend_lost_unresponsive, "
                           "...)", ["backend", "reason"], registry=REGISTRY)
BACKEND_RTT_MS = Gauge("duplex_backend_rtt_ms", "Round trip of the last health probe of the backend, in ms",
                       ["backend"], registry=REGISTRY)
BACKEND_LOST = Counter("duplex_backend_connections_lost", "Live conversations whose backend connection was given "
                       "up, by why: closed (dropped and not resumed) or unresponsive (open, but nothing came back)",
                       ["reason"], registry=REGISTRY)
BACKEND_FAILOVERS = Counter("duplex_backend_failovers", "Conversations moved to another backend after theirs "
                            "was lost", registry=REGISTRY)

#: Tools at the edge (agent/tools): the model's function calls the worker ran or refused.
TOOL_CALLS = Counter("duplex_tool_calls", "Function calls of the model the worker's edge took, by tool (one per "
                     "call_id; (unknown): a name the model made up)", ["tool"], registry=REGISTRY)
TOOL_FAILURES = Counter("duplex_tool_failures", "Function calls answered with an error output, by reason: "
                        "unknown_tool, invalid_arguments, too_many_calls, tool_error (the tool's ToolError), "
                        "tool_failed (it raised), tool_timeout, caller_interrupted (an after-heard tool talked over), "
                        "tool_cancelled (the call's connection ended while it ran), or "
                        "the code of a call-control refusal (e.g. needs_phone_call)",
                        ["reason"], registry=REGISTRY)
TOOL_RUN_SECONDS = Histogram("duplex_tool_run_seconds", "How long tools ran, from their start to their answer "
                             "(or their timeout)", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2.5, 5, 10, 30),
                             registry=REGISTRY)

#: The process itself: process_resident_memory_bytes and process_open_fds (prometheus_client's
#: standard names), threads, asyncio tasks and livekit FFI handles (agent/process_figures).
ProcessCollector(registry=REGISTRY)
REGISTRY.register(ProcessFigures())


def render() -> bytes:
    return generate_latest(REGISTRY)
