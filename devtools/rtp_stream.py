"""A caller's Opus RTP stream, played through a receive buffer on a simulated clock.

For unit tests and the receive-buffer bench: real Opus packets from libopus (the
caller's encoder, in-band FEC on), sent every 20 ms, each given an arrival time (a
path delay plus jitter, so packets can overtake one another) or dropped; the buffer
gets them in arrival order and is drained at its own deadlines in between, as the
worker's loop would.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from duplex_agent.webrtc.direct.libopus import OpusDecoder, OpusEncoder
from duplex_agent.webrtc.direct.receive_buffer import FRAME_SAMPLES, SAMPLE_RATE, ReceiveBuffer

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@dataclass
class RtpPacket:
    sequence: int
    timestamp: int
    payload: bytes
    sent: float
    ssrc: int = 0x1234
    arrival: float | None = None  # None: lost


def opus_packets(audio: np.ndarray, *, bitrate: int = 32000, expected_loss_percent: int = 10,
                 first_sequence: int = 1000, first_timestamp: int = 123456) -> list[RtpPacket]:
    """``audio`` (float32, 48 kHz) as one 20 ms Opus packet per frame, as a WebRTC caller sends it."""
    encoder = OpusEncoder(bitrate, expected_loss_percent=expected_loss_percent)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros(-pcm.size % FRAME_SAMPLES, np.int16)])
    return [RtpPacket((first_sequence + n) & 0xFFFF, (first_timestamp + n * FRAME_SAMPLES) & 0xFFFFFFFF,
                      encoder.encode(pcm[n * FRAME_SAMPLES:(n + 1) * FRAME_SAMPLES]), n * FRAME_S)
            for n in range(pcm.size // FRAME_SAMPLES)]


def through_opus(audio: np.ndarray, *, bitrate: int = 32000) -> np.ndarray:
    """``audio`` (float32, 48 kHz) as the callee hears it with no loss: encoded and decoded by
    libopus, 20 ms a packet (padded to whole frames)."""
    decoder = OpusDecoder()
    return np.concatenate([decoder.decode(p.payload) for p in opus_packets(audio, bitrate=bitrate)])


def deliver(packets: list[RtpPacket], *, delay_s: float = 0.01, jitter_s: float = 0.0, loss: float = 0.0,
            bursts: tuple[float, float] | None = None, lost: set[int] = frozenset(), seed: int = 1) -> list[RtpPacket]:
    """Give each packet an arrival: ``delay_s`` plus uniform ±``jitter_s``. Dropped: random ``loss``,
    Gilbert-Elliott ``bursts`` (p good->bad, p bad->good; all lost while bad), and the indices in ``lost``."""
    rng = random.Random(seed)
    bad = False
    for index, packet in enumerate(packets):
        if bursts is not None:
            bad = rng.random() < (1 - bursts[1] if bad else bursts[0])
        dropped = index in lost or bad or rng.random() < loss
        packet.arrival = None if dropped else packet.sent + delay_s + rng.uniform(-jitter_s, jitter_s)
    return packets


@dataclass
class Playback:
    """What a buffer handed on, and when (simulated seconds)."""

    audio: list[np.ndarray] = field(default_factory=list)
    handed_at: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    def timeline(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


def play(packets: list[RtpPacket], *, until: float | None = None, frames: int | None = None,
         make: Callable[..., ReceiveBuffer] = ReceiveBuffer) -> tuple[ReceiveBuffer, Playback]:
    """Feed the packets that arrive in arrival order, draining the buffer at its deadlines, until
    ``until`` (default: the last arrival), and no further once ``frames`` frames were handed on."""
    playback = Playback()
    now = [0.0]

    def sink(audio: np.ndarray, rate: int) -> None:
        assert rate == SAMPLE_RATE
        playback.audio.append(audio)
        playback.handed_at.append(now[0])

    buffer = make(sink, on_frame=lambda outcome, _delay: playback.outcomes.append(outcome))
    arriving = sorted((p for p in packets if p.arrival is not None), key=lambda p: p.arrival)
    end = until if until is not None else (arriving[-1].arrival if arriving else 0.0)

    def run_deadlines(limit: float) -> None:
        while (deadline := buffer.next_deadline()) is not None and deadline <= limit and (
                frames is None or buffer.counts.samples_out < frames * FRAME_SAMPLES):
            now[0] = deadline
            buffer.drain(deadline)

    for packet in arriving:
        if packet.arrival > end:
            break
        run_deadlines(packet.arrival)
        now[0] = packet.arrival
        buffer.push(packet.ssrc, packet.sequence, packet.timestamp, packet.payload, packet.arrival)
    run_deadlines(end)
    return buffer, playback
