"""The caller's audio through our own receive buffer (``receive_buffer=adaptive``, the default).

aiortc's receiver parses the caller's RTP; each packet comes here instead of to
aiortc's jitter buffer (``aiortc_receiver.take_packets``) and goes into a
``ReceiveBuffer`` on the loop, which decodes, recovers and conceals in line
(libopus, tens of microseconds a frame) and hands the caller's timeline to
``sink``. One timer on the loop fills a hole at its deadline when no packet
comes to fill it, so a caller whose packets stop still has a timeline that runs,
and is heard again as soon as packets return. A timer that fires late (the loop
was busy) first waits as long again: the packets of that time are then still
queued in the socket and in aiortc's pipeline, not lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import numpy as np
from aiortc import RTCRtpReceiver
from aiortc.rtp import RtpPacket

from duplex_agent.agent.metrics import RECEIVE_BUFFERS, RECEIVE_DELAY_MS
from duplex_agent.webrtc.direct.aiortc_receiver import take_decoder_queue, take_packets
from duplex_agent.webrtc.direct.receive_buffer import MAX_TARGET_DELAY_S, ReceiveBuffer

logger = logging.getLogger("duplex_agent.webrtc")

#: A deadline timer this late means the loop was held up (not that the packets stopped).
STALL_S = 0.01


class AdaptiveCallerAudioReader:
    """One call's caller track: packets in from aiortc's receiver, the timeline out to ``sink``."""

    def __init__(
        self,
        receiver: RTCRtpReceiver,
        sink: Callable[[np.ndarray, int], None],
        *,
        call_id: str,
        on_ended: Callable[[], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sink = sink
        self._on_ended = on_ended
        self._call_id = call_id
        self._stopped = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._hold_until: float | None = None  # a late timer waits for queued packets until then
        self.last_packet_at: float | None = None  # the loop's clock at the caller's last packet (media timeout)
        self.buffer = ReceiveBuffer(self._hand_on, on_frame=_record_delay)
        take_packets(receiver, self)
        take_decoder_queue(receiver, self)
        RECEIVE_BUFFERS.track(call_id, self.figures)

    def figures(self) -> dict[str, float]:
        """The buffer's counts and delays (ms), for /metrics."""
        delays = self.buffer.delays_s
        return {**self.buffer.counts.as_dict(), "delay_ms": 1000.0 * delays[-1] if delays else 0.0,
                "delay_p95_ms": 1000.0 * self.buffer.delay_p95_s(),
                "target_delay_ms": 1000.0 * self.buffer.target_delay_s}

    # ---- the receiver's side (on the loop) ----

    def add(self, packet: RtpPacket) -> tuple[bool, None]:
        """An RTP packet from aiortc's receiver (in its jitter buffer's place): no PLI, no frame for its decoder."""
        if not self._stopped.is_set():
            self.last_packet_at = now = self._loop.time()
            try:
                self.buffer.push(packet.ssrc, packet.sequence_number, packet.timestamp, packet.payload, now)
            except Exception:  # a bad packet must not end the receiver's task: it is counted and the call goes on
                logger.exception("caller packet failed in the receive buffer")
            self._schedule()
        return False, None

    def put(self, task: object) -> None:
        """aiortc's decoder queue: only ``None`` comes here (the receiver stops), the packets came to ``add``."""
        if task is None and not self._stopped.is_set():
            self._stop()
            logger.debug("caller track ended")
            if self._on_ended is not None:
                self._on_ended()

    def get(self) -> None:  # aiortc's decoder thread waits here until the receiver stops
        self._stopped.wait()
        return None

    async def close(self) -> None:
        self._stop()

    # ---- the timeline's clock ----

    def _schedule(self) -> None:
        deadline = self.buffer.next_deadline()
        if deadline is not None and self._hold_until is not None:
            deadline = max(deadline, self._hold_until)
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, deadline
        if deadline is not None and not self._stopped.is_set():
            self._timer = self._loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        now, due = self._loop.time(), self._timer_at
        assert due is not None
        self._timer = self._timer_at = None
        if self._hold_until is None and now - due > STALL_S:
            # The loop was held up: the caller's packets of that time may still be in the socket and in
            # aiortc's receive pipeline. They get as long again before their places are filled.
            self._hold_until = now + min(now - due, MAX_TARGET_DELAY_S)
            self._schedule()
            return
        self._hold_until = None
        try:
            self.buffer.drain(now)
        except Exception:
            logger.exception("caller receive buffer failed to fill a hole")
            self._timer_at = self.buffer.next_deadline()  # not again for this hole: the next packet retries
            return
        self._schedule()

    def _hand_on(self, samples: np.ndarray, rate: int) -> None:
        try:
            self._sink(samples, rate)
        except Exception:
            logger.exception("caller audio sink failed")

    def _stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()  # lets aiortc's idle decoder thread go; the receiver's own stop joins it
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        RECEIVE_BUFFERS.forget(self._call_id)


def _record_delay(_outcome: str, delay_s: float | None) -> None:
    if delay_s is not None:
        RECEIVE_DELAY_MS.observe(1000.0 * delay_s)
