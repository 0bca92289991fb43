"""What speaking vLLM-Omni's wire costs per server event on our endpoint.

A: the flat encoding (``codec.encode_event`` + ``server_event_seq`` + JSON), what the
endpoint did before. B: the vLLM-Omni shapes (``ServerWireEncoder``: nested objects,
server ``event_id``, marks) + seq + JSON + the replay journal. A and B alternate in
the same process, event by event, so machine load hits both alike.

Run: python -m bench.wire_encoding [rounds]   (default 2000; 200 is a quick run)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from bench.stats import summary
from duplex_agent.agent.app.session_store import ReplayJournal
from duplex_agent.agent.protocol import codec
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.omni_wire import ServerWireEncoder


def sample_events(n: int) -> list[p.ServerEvent]:
    audio = (0.2 * np.sin(np.arange(2400) / 5)).astype(np.float32)  # 100 ms at 24 kHz
    return [
        p.ResponseCreated("resp_1", "item_1"),
        p.ResponseAudioDelta("resp_1", "item_1", audio, 24000, 100.0 * n, 100.0,
                             [{"text": "word", "start_ms": 100.0 * n, "end_ms": 100.0 * n + 90}]),
        p.ResponseTranscriptDelta("resp_1", "item_1", " word"),
        p.ResponseDone("resp_1", "completed", audio_ms=100.0 * n),
    ]


def main(rounds: int) -> None:
    encoder = ServerWireEncoder("sess_bench")
    journal = ReplayJournal(1 << 40)
    flat: dict[str, list[float]] = {}
    shaped: dict[str, list[float]] = {}
    seq = 0
    for n in range(rounds):
        for event in sample_events(n):
            seq += 1
            start = time.perf_counter()
            data = codec.encode_event(event)
            data["server_event_seq"] = seq
            json.dumps(data, separators=(",", ":"))
            middle = time.perf_counter()
            data = encoder.encode(event)
            data["server_event_seq"] = seq
            journal.record(seq, json.dumps(data, separators=(",", ":")))
            end = time.perf_counter()
            flat.setdefault(event.type, []).append(1e6 * (middle - start))
            shaped.setdefault(event.type, []).append(1e6 * (end - middle))
    print(f"per-event encoding on the realtime websocket, {rounds} rounds (A flat, B vLLM-Omni shapes + journal)")
    for kind in flat:
        ratio = statistics.median(shaped[kind]) / statistics.median(flat[kind])
        print(f"  {kind:40s} A {summary(flat[kind], 'us')}")
        print(f"  {'':40s} B {summary(shaped[kind], 'us')}  B/A median {ratio:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
