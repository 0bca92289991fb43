"""The caller's receive buffer: Opus RTP packets in, the caller's timeline out, every sample of it.

Packets are placed by RTP timestamp, so a packet that comes after a later one is put
back in its place, and a lost one never costs its neighbours. The timeline is handed
on in order as soon as it is whole: a packet that arrives in order is decoded and
handed on at once. A hole waits for its packet until a deadline, the hole's expected
arrival (the stream's earliest transit over the last seconds) plus a target delay
that follows the measured jitter: one frame (the lost packet's successor, whose FEC
recovers it, is due a frame later) plus the larger of four times the RFC 3550
interarrival jitter estimate and how late the latest 2 % of recent packets came
(at least 5 ms; at most ``MAX_TARGET_DELAY_S`` in all). At the deadline the hole is
filled with exactly its own duration: from the next packet's in-band FEC when that
packet is there and carries it, else by libopus's concealment. A packet that comes
after its place was filled is dropped as late, and is evidence that the target is too
small for this path: the target is raised to cover how late it came (within the bound;
one later than the bound teaches nothing), held there ``LATE_HOLD_S`` after the last
packet that needed it (late, or put in place only thanks to it), then shrunk back by
``LATE_DECAY`` while none comes (the network calmed).
The percentile alone misses stragglers rarer than 2 %, and knows little in a stream's
first packets. A hole with no packet after it yet (the stream has stopped, or is late
as a whole) waits ``OPEN_HOLE_GRACE_S`` longer.

Each sample of the timeline is accounted for in ``ReceiveCounts``: received,
recovered (FEC), concealed, and the packets dropped as late, reordered, duplicated,
not Opus, or from a restart (an SSRC change, a timestamp jump of over
``RESYNC_S`` ahead of where the wall clock puts the stream or behind what was
already handed on). A restart starts a new stream where the timeline stands: what
was handed on stays. A packet newer than any before it that comes after its place
was filled means the stream as a whole fell behind the clock (a sender that stalled
and skipped the stall, a path that grew longer): the stream rejoins there, counted
as a timestamp jump, and nothing is dropped.

No I/O here: the owner feeds packets with their arrival times and calls ``drain``
at ``next_deadline`` (its loop's clock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from duplex_agent.webrtc.direct.libopus import OpusDecoder, OpusError, packet_has_fec, packet_samples
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

# FRAME_SAMPLES (20 ms at 48 kHz) is what WebRTC callers send, and the unit holes are filled in.
_MIN_CHUNK = 120  # 2.5 ms: the smallest duration libopus decodes
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
MAX_TARGET_DELAY_S = 0.2
JITTER_MULTIPLE = 4.0
#: The least margin past the next packet's expected arrival: a lost packet's successor,
#: whose FEC recovers it, is due one frame after it.
MIN_MARGIN_S = 0.005
#: A hole with no packet after it yet waits this much longer: the whole stream may be late (a
#: busy sender or loop), and concealing would insert time into the caller's speech: a stall of
#: the caller's loop (on a loaded machine, half a second and more) that inserts 500 ms of
#: concealment reads as the end of the caller's turn. While packets stay away the timeline runs
#: this far behind the clock, and catches up when they return.
OPEN_HOLE_GRACE_S = 0.5
#: After a packet that came too late, the target covers its lateness plus MIN_MARGIN_S for this
#: long after the last packet that needed it, then shrinks back by LATE_DECAY seconds per second
#: (40 ms above the jitter's target are gone 18 s after the last straggler).
LATE_HOLD_S = 10.0
LATE_DECAY = 0.005
#: A packet this far from where the wall clock puts the stream restarts it.
RESYNC_S = 1.0
#: The spread is taken over this many recent packets (5 s), at this percentile; the earliest
#: transit over the last second's, so that it follows a path or a sender that became later (a
#: sender whose clock skipped a stall is later from then on); both recomputed every few packets.
_TRANSITS_KEPT = 250
_EARLIEST_OVER = 50
SPREAD_PERCENTILE = 98
_SPREAD_EVERY = 8
_DELAYS_KEPT = 500  # 10 s of frames for the p95
_SEQUENCE_JUMP = 100
_MAX_PENDING = 256  # packets held at once (about 5 s of 20 ms packets)
_U32 = 1 << 32


@dataclass
class ReceiveCounts:
    """What became of the caller's packets and of each 20 ms of their timeline."""

    received: int = 0  # frames decoded from their own packet
    recovered: int = 0  # lost frames recovered from the next packet's in-band FEC
    concealed: int = 0  # frames filled by concealment (lost, or their packet was not Opus)
    lost: int = 0  # frames whose packet had not come by their deadline
    reordered: int = 0  # packets that came after a later one, in time to be put in place
    late: int = 0  # packets that came after their place was filled (or were left by a restart)
    duplicates: int = 0
    invalid: int = 0  # packets whose payload is not Opus (garbage, truncated, empty)
    ssrc_changes: int = 0
    timestamp_jumps: int = 0
    sequence_jumps: int = 0
    samples_out: int = 0  # the timeline handed on, in samples at 48 kHz

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Packet:
    payload: bytes | None  # None: not Opus (its place is concealed)
    samples: int
    arrival: float


class _Transits:
    """The stream's recent transits (arrival minus RTP time): the earliest, and how far the late ones spread past it."""

    def __init__(self, arrival: float) -> None:
        self.recent: deque[float] = deque([arrival], maxlen=_TRANSITS_KEPT)
        self.earliest = arrival
        self.spread = 0.0  # the SPREAD_PERCENTILE of (transit - earliest): how late packets come
        self._since = 0

    def add(self, transit: float) -> None:
        self.recent.append(transit)
        self.earliest = min(self.earliest, transit)
        self._since += 1
        if self._since >= _SPREAD_EVERY:  # a percentile of a few hundred values, not on every packet
            self._since = 0
            values = np.fromiter(self.recent, np.float64, len(self.recent))
            self.earliest = float(values[-_EARLIEST_OVER:].min())
            self.spread = float(np.percentile(values, SPREAD_PERCENTILE)) - self.earliest


class ReceiveBuffer:
    """One caller's stream; ``sink(samples, 48000)`` gets the timeline in order (float32 mono)."""

    def __init__(self, sink: Callable[[np.ndarray, int], None], *,
                 on_frame: Callable[[str, float | None], None] | None = None) -> None:
        self._sink = sink
        self._on_frame = on_frame  # (outcome, arrival-to-handoff delay or None): for metrics
        self.counts = ReceiveCounts()
        self._decoder = OpusDecoder()
        self._ssrc: int | None = None
        self._last_seq: int | None = None
        self._cursor: int | None = None  # the next sample of the timeline, in the stream's unwrapped RTP time
        self._highest = 0
        self._base = 0  # unwrapped RTP time of the stream's first packet
        self._pending: dict[int, _Packet] = {}
        self._transits = _Transits(0.0)
        self._last_transit: float | None = None
        self.jitter_s = 0.0  # RFC 3550 interarrival jitter, in seconds
        self._late_floor_s = 0.0  # the least target, learned from packets that came too late
        self._late_at: float | None = None  # arrival of the last of them
        self._floor_from = 0.0  # the floor as last learned (it shrinks from there)
        self.delays_s: deque[float] = deque(maxlen=_DELAYS_KEPT)  # arrival to handoff, per frame from a packet

    # ---- figures ----

    @property
    def target_delay_s(self) -> float:
        """How long a hole waits for its packet past the packet's expected arrival."""
        return min(MAX_TARGET_DELAY_S, max(self._jitter_target_s(), self._late_floor_s))

    def _jitter_target_s(self) -> float:
        """The target from the measured jitter and spread alone."""
        return FRAME_S + max(MIN_MARGIN_S, JITTER_MULTIPLE * self.jitter_s, self._transits.spread)

    def delay_p95_s(self) -> float:
        return float(np.percentile(self.delays_s, 95)) if self.delays_s else 0.0

    # ---- packets in ----

    def push(self, ssrc: int, sequence: int, timestamp: int, payload: bytes, arrival: float) -> None:
        """One RTP packet (its Opus payload) that arrived at ``arrival`` (the owner's clock, seconds)."""
        if self._late_floor_s:
            self._shrink_late_floor(arrival)
        if self._ssrc is not None and ssrc != self._ssrc:
            self.counts.ssrc_changes += 1
            self._restart()
        self._ssrc = ssrc
        step = ((sequence - self._last_seq + 0x8000) & 0xFFFF) - 0x8000 if self._last_seq is not None else 1
        if abs(step) > _SEQUENCE_JUMP:
            self.counts.sequence_jumps += 1
        self._last_seq = sequence

        try:
            samples, opus = packet_samples(payload), payload
        except OpusError:
            self.counts.invalid += 1
            samples, opus = FRAME_SAMPLES, None

        if self._cursor is None:
            rtp = timestamp
            self._start(rtp, arrival)
        else:
            rtp = self._highest + (((timestamp - self._highest) + (_U32 >> 1)) % _U32) - (_U32 >> 1)
            expected = self._base + (arrival - self._transits.earliest) * SAMPLE_RATE
            # Far ahead of the wall clock, or far behind what was handed on (a sender that paused its
            # clock); a packet that is only late, its place not yet handed on, is no jump.
            if rtp - expected > RESYNC_S * SAMPLE_RATE or self._cursor - rtp > RESYNC_S * SAMPLE_RATE:
                self.counts.timestamp_jumps += 1
                self._restart()
                self._start(rtp, arrival)

        assert self._cursor is not None  # set by _start
        if rtp < self._cursor:
            if rtp <= self._highest:  # overtaken by a later packet, and its place was filled: too late
                self.counts.late += 1
                self._learn_from_late(arrival - (rtp - self._base) / SAMPLE_RATE, arrival)
                return
            # The newest packet yet, after its place was filled: the stream as a whole fell behind the
            # clock (a sender whose loop stalled and whose clock skipped the stall, a longer path). The
            # stream goes on from here where the timeline stands, with its decoder's state: what was
            # filled is inserted time. Nothing is pending (all of it would be newer than this packet).
            self.counts.timestamp_jumps += 1
            self._start(rtp, arrival)
        transit = arrival - (rtp - self._base) / SAMPLE_RATE
        if rtp in self._pending:
            self.counts.duplicates += 1
            return
        if len(self._pending) >= _MAX_PENDING:
            self.counts.late += 1
            return
        if rtp < self._highest:
            self.counts.reordered += 1
            if self._late_floor_s:  # put in place thanks to the floor? then the floor is still needed
                self._raise_late_floor(transit, arrival)
        if self._last_transit is not None:
            self.jitter_s += (abs(transit - self._last_transit) - self.jitter_s) / 16
        self._last_transit = transit
        self._transits.add(transit)
        self._highest = max(self._highest, rtp)
        self._pending[rtp] = _Packet(opus, samples, arrival)
        self._drain(arrival, open_holes=False)

    def _learn_from_late(self, transit: float, arrival: float) -> None:
        """A packet of ``transit`` came after its place was filled: a sample of the path too (the
        spread's percentile counts it), and it raises the least target (``_raise_late_floor``)."""
        self._transits.add(transit)
        self._raise_late_floor(transit, arrival)

    def _raise_late_floor(self, transit: float, arrival: float) -> None:
        """A packet of ``transit`` came later than the jitter's target waits: from now on (for
        ``LATE_HOLD_S`` more) a hole waits long enough for it. One later than the bound teaches
        nothing (no target allowed would have waited for it)."""
        wanted = transit - self._transits.earliest + MIN_MARGIN_S
        if self._jitter_target_s() < wanted <= MAX_TARGET_DELAY_S:
            self._late_floor_s = self._floor_from = max(self._late_floor_s, wanted)
            self._late_at = arrival

    def _shrink_late_floor(self, now: float) -> None:
        assert self._late_at is not None
        calm = now - self._late_at - LATE_HOLD_S
        if calm > 0:
            self._late_floor_s = max(0.0, self._floor_from - LATE_DECAY * calm)

    def _start(self, rtp: int, arrival: float) -> None:
        self._cursor = self._highest = self._base = rtp
        self._transits = _Transits(arrival)
        self._last_transit = None

    def _restart(self) -> None:
        """A new stream begins where the timeline stands; what the old one still held is dropped."""
        self.counts.late += len(self._pending)
        self._pending.clear()
        self._cursor = None
        self._decoder.reset()

    # ---- the timeline out ----

    def next_deadline(self) -> float | None:
        """When the hole at the head of the timeline is filled (None: nothing to wait for)."""
        if self._cursor is None or self._cursor in self._pending:
            return None
        deadline = self._transits.earliest + (self._cursor - self._base) / SAMPLE_RATE + self.target_delay_s
        return deadline if self._pending else deadline + OPEN_HOLE_GRACE_S

    def drain(self, now: float) -> None:
        """The clock: hand on all of the timeline that is whole, or whose hole's deadline passed by ``now``."""
        self._drain(now, open_holes=True)

    def _drain(self, now: float, *, open_holes: bool) -> None:
        """A packet's arrival fills only holes a later packet has come after: one with none after it
        may be a packet still on its way to the buffer behind a busy loop, and is left to the clock."""
        while self._cursor is not None:
            packet = self._pending.pop(self._cursor, None)
            if packet is not None:
                self._hand_packet(packet, now)
                continue
            deadline = self.next_deadline()
            if deadline is None or now < deadline or not (open_holes or self._pending):
                return
            self._fill_hole(now)

    def _hand_packet(self, packet: _Packet, now: float) -> None:
        audio = None
        if packet.payload is not None:
            try:
                audio = self._decoder.decode(packet.payload)
            except OpusError:
                self.counts.invalid += 1
        if audio is None or audio.size != packet.samples:
            self._conceal(packet.samples)
            return
        self.counts.received += 1
        self._hand(audio, "received", now - packet.arrival)

    def _fill_hole(self, now: float) -> None:
        assert self._cursor is not None
        later = [rtp for rtp in self._pending if rtp > self._cursor]
        following = min(later) if later else None
        gap = following - self._cursor if following is not None else FRAME_SAMPLES
        self.counts.lost += 1
        if following is not None and gap <= FRAME_SAMPLES:
            packet = self._pending[following]
            if gap % _MIN_CHUNK == 0 and gap <= packet.samples and packet.payload and packet_has_fec(packet.payload):
                try:
                    audio = self._decoder.decode_fec(packet.payload, gap)
                except OpusError:
                    audio = None
                if audio is not None and audio.size == gap:
                    self.counts.recovered += 1
                    self._hand(audio, "recovered", now - packet.arrival)
                    return
        self._conceal(min(gap, FRAME_SAMPLES))

    def _conceal(self, samples: int) -> None:
        """Exactly ``samples`` of concealment (libopus's, in 2.5 ms steps; zeros for a remainder below that)."""
        whole = samples - samples % _MIN_CHUNK
        audio = np.zeros(samples, np.float32)
        if whole:
            try:
                concealed = self._decoder.conceal(whole)
                audio[: concealed.size] = concealed[:whole]
            except OpusError:
                pass
        self.counts.concealed += 1
        self._hand(audio, "concealed", None)

    def _hand(self, audio: np.ndarray, outcome: str, delay_s: float | None) -> None:
        assert self._cursor is not None
        self._cursor += audio.size
        self.counts.samples_out += audio.size
        overtaken = [rtp for rtp in self._pending if rtp < self._cursor]  # packets overlapping what was handed
        for rtp in overtaken:
            del self._pending[rtp]
        self.counts.late += len(overtaken)
        if delay_s is not None:
            self.delays_s.append(delay_s)
        if self._on_frame is not None:
            self._on_frame(outcome, delay_s)
        self._sink(audio, SAMPLE_RATE)
