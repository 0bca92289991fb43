"""The agent's Opus FEC follows the loss the caller reports in its RTCP receiver reports.

In-band FEC costs bits of the voice: it pays only on a path that loses packets. aiortc's
sender keeps the latest report block about our stream as the ``remote-inbound-rtp``
entry of ``RTCRtpSender.getStats()`` (``fractionLost``: RFC 3550's 8-bit fraction of the
last interval); ``LossFollower`` plans the encoder's expected loss for the worst of the
last few reports, and turns FEC off once they all say nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque

from aiortc import RTCRtpSender

from duplex_agent.webrtc.direct.tracks import OpusVoiceEncoder

logger = logging.getLogger("duplex_agent.webrtc")

#: How often the sender's stats are read (browsers report about once a second).
POLL_INTERVAL_S = 2.0
#: The expected loss is the worst of this many reports (a burst is not forgotten at the next clean one).
REPORTS_KEPT = 4
#: Never planned for more than this: past it FEC cannot keep up and only costs the voice.
MAX_EXPECTED_LOSS_PERCENT = 30


class LossFollower:
    """Receiver reports in (fraction lost, 0-255), the encoder's expected loss out."""

    def __init__(self, encoder: OpusVoiceEncoder) -> None:
        self.encoder = encoder
        self.reports: deque[float] = deque(maxlen=REPORTS_KEPT)

    def report(self, fraction_lost: int) -> int:
        """One report block's fraction lost; returns the expected loss (percent) now set."""
        self.reports.append(max(0, min(255, fraction_lost)) / 256)
        percent = min(MAX_EXPECTED_LOSS_PERCENT, math.ceil(100 * max(self.reports)))
        if percent != self.encoder.expected_loss_percent:
            logger.debug("caller reports %.1f %% lost: Opus FEC planned for %d %%", 100 * self.reports[-1], percent)
            self.encoder.set_expected_loss(percent)
        return percent

    async def follow(self, sender: RTCRtpSender) -> None:
        """Read the sender's latest receiver report every ``POLL_INTERVAL_S`` until cancelled."""
        seen = None
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            try:
                stats = await sender.getStats()
            except Exception:  # a sender being torn down; the next round tries again
                logger.debug("sender stats unavailable", exc_info=True)
                continue
            for entry in stats.values():
                if getattr(entry, "type", None) == "remote-inbound-rtp" and entry.timestamp != seen:
                    seen = entry.timestamp
                    self.report(entry.fractionLost)
