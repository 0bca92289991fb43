"""The direct path's receive buffer against aiortc's, on the same simulated lossy streams, in one run.

Real Opus packets (libopus, in-band FEC planned for 10 % loss, as our sender and browsers
send them) of Piper's speech, given arrival times by a simulated network (path delay,
uniform jitter that reorders, random or Gilbert-Elliott burst loss), fed in arrival order
to our ``ReceiveBuffer`` (drained at its deadlines), to ours as it was before it learned from
late packets (``before``: ``ReceiveBufferBefore``) and to aiortc's audio
``JitterBuffer(16, prefetch=4)``. Per condition and buffer: the share of the caller's 20 ms
frames the call path got from their own packet, recovered from FEC, concealed, or never
got at all (aiortc's leaves the gap empty); the packets ours dropped as too late; the delay from a packet's arrival to its
frame being handed on (p50/p95); and the lag (p95) of every frame handed on, concealed
ones included, behind where a perfect network would have put it (sent + path delay).
Figures from a simulated clock: no machine load in them.

Run: python -m bench.receive_buffer [--runs 8]
"""

from __future__ import annotations

import argparse
import re
import statistics

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket as AiortcPacket

from bench.report import Report
from bench.stats import percentile
from devtools.rtp_stream import deliver, opus_packets, play
from devtools.speech import speak
from duplex_agent.webrtc.direct.receive_buffer import ReceiveBuffer

SENTENCES = ("Could you tell me what the weather is like in Paris this weekend?",
             "Please book a table for two people tonight at the little Italian place.")
CONDITIONS = {
    "clean (10 ms path)": dict(delay_s=0.01, jitter_s=0.0005),
    "40 +- 15 ms jitter": dict(delay_s=0.04, jitter_s=0.015),
    "3 % loss": dict(delay_s=0.01, jitter_s=0.0005, loss=0.03),
    "3 % loss, 40 +- 15 ms": dict(delay_s=0.04, jitter_s=0.015, loss=0.03),
    "10 % loss": dict(delay_s=0.01, jitter_s=0.0005, loss=0.10),
    "bursts (GE 1 %/20 %)": dict(delay_s=0.01, jitter_s=0.0005, bursts=(0.01, 0.2)),
    "~25 % reordered, 40 +- 30": dict(delay_s=0.04, jitter_s=0.03),
    "stragglers 1 in 40, +80 ms": dict(delay_s=0.01, jitter_s=0.0005, stragglers=(40, 0.08)),
}
#: The condition of the headline figure: a mobile caller's network.
HEADLINE = "3 % loss, 40 +- 15 ms"


class ReceiveBufferBefore(ReceiveBuffer):
    """Ours as it was before it learned from late packets: a late packet is only counted."""

    def _learn_from_late(self, transit: float, arrival: float) -> None:
        pass


#: Our buffer now, ours before it learned from late packets, aiortc's.
BUFFERS = {"ours": ReceiveBuffer, "before": ReceiveBufferBefore, "aiortc": None}


def delay_stragglers(stream, every: int, late_s: float) -> None:
    """Every ``every``-th packet (from the 10th) comes ``late_s`` later than the path puts it."""
    for packet in stream[10::every]:
        if packet.arrival is not None:
            packet.arrival += late_s


def aiortc_buffer(stream, path_s: float) -> tuple[int, list[float], list[float]]:
    """Frames aiortc's audio jitter buffer hands on, each one's arrival-to-handoff delay, and its lag."""
    buffer = JitterBuffer(capacity=16, prefetch=4)
    arrivals = {p.timestamp: p.arrival for p in stream if p.arrival is not None}
    sent = {p.timestamp: p.sent for p in stream}
    handed, delays, lags = 0, [], []
    for packet in sorted((p for p in stream if p.arrival is not None), key=lambda p: p.arrival):
        rtp = AiortcPacket(payload_type=111, sequence_number=packet.sequence, timestamp=packet.timestamp,
                           ssrc=packet.ssrc, payload=packet.payload)
        rtp._data = packet.payload  # what aiortc's receiver depayloads for Opus
        _, frame = buffer.add(rtp)
        if frame is not None:
            handed += 1
            delays.append(packet.arrival - arrivals[frame.timestamp])
            lags.append(packet.arrival - sent[frame.timestamp] - path_s)
    return handed, delays, lags


def run(runs: int, report: Report) -> None:
    """Print the table and add each condition's figures to the report."""
    speech = [speak(text, 48000, before_ms=200, after_ms=200) for text in SENTENCES]
    print(f"{'condition':26} {'buffer':7} {'own pkt':>8} {'FEC':>6} {'PLC':>6} {'missing':>8} {'late':>6} "
          f"{'delay p50':>10} {'p95':>7} {'lag p95':>8}  lost packets")
    for name, condition in CONDITIONS.items():
        network = {k: v for k, v in condition.items() if k != "stragglers"}
        totals = {which: [0, 0, 0, 0, 0] for which in BUFFERS}
        delays: dict[str, list[float]] = {which: [] for which in BUFFERS}
        lags: dict[str, list[float]] = {which: [] for which in BUFFERS}
        lost = frames = 0
        for seed in range(runs):
            stream = deliver(opus_packets(speech[seed % len(speech)]), seed=seed, **network)
            if "stragglers" in condition:
                delay_stragglers(stream, *condition["stragglers"])
            frames += len(stream)
            lost += sum(p.arrival is None for p in stream)
            for which, make in BUFFERS.items():
                if make is None:
                    continue
                buffer, playback = play(stream, until=stream[-1].sent + 1.0, frames=len(stream), make=make)
                c = buffer.counts
                totals[which] = [a + b for a, b in zip(totals[which], [
                    c.received, c.recovered, c.concealed, len(stream) - c.received - c.recovered - c.concealed,
                    c.late], strict=True)]
                delays[which] += [1000 * d for d in buffer.delays_s]
                lags[which] += [1000 * (at - p.sent - network["delay_s"]) for at, p in zip(playback.handed_at, stream)]
            handed, theirs, their_lags = aiortc_buffer(stream, network["delay_s"])
            totals["aiortc"][0] += handed
            totals["aiortc"][3] += len(stream) - handed
            delays["aiortc"] += [1000 * d for d in theirs]
            lags["aiortc"] += [1000 * lag for lag in their_lags]
        missing_share: dict[str, float] = {}
        for which in BUFFERS:
            own, fec, plc, missing, late = (100 * n / frames for n in totals[which])
            missing_share[which] = missing
            d = delays[which]
            late_text = "-" if BUFFERS[which] is None else f"{late:.1f}%"
            print(f"{name:26} {which:7} {own:7.1f}% {fec:5.1f}% {plc:5.1f}% {missing:7.1f}% {late_text:>6} "
                  f"{statistics.median(d):7.1f} ms {percentile(d, 95):5.1f} ms {percentile(lags[which], 95):5.1f} ms"
                  f"  {100 * lost / frames:.1f} %")
        # The floor is aiortc's buffer as shipped, fed the same packets.
        slug = "" if name == HEADLINE else "." + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        report.add(f"receive_buffer.lost{slug}", f"caller frames the worker never got, {name} (simulated)",
                   missing_share["ours"], floor=missing_share["aiortc"], unit="%", n=frames, area="network")
        report.add(f"receive_buffer.delay_p95{slug}", f"receive buffer's delay p95, arrival to handoff, {name}",
                   percentile(delays["ours"], 95), floor=percentile(delays["aiortc"], 95), unit="ms",
                   n=len(delays["ours"]), area="network")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8, help="streams per condition (default 8)")
    parser.add_argument("--quick", action="store_true", help="2 streams per condition")
    args = parser.parse_args()
    report = Report("receive_buffer", quick=args.quick)
    run(2 if args.quick else args.runs, report)
    report.write()


if __name__ == "__main__":
    main()
