"""Screening an answered outbound call for a voicemail box, and acting on the dial request's policy.

The called party's audio, from the answer on, goes to an ``AnsweringMachineDetector``. A person:
the call goes on as it was. A machine: ``hang_up`` ends the call at once; ``leave_message`` waits
for the end of the greeting (its beep), has the model say the message, then ends it.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from duplex_agent.agent import metrics
from duplex_agent.agent.telephony.amd import MACHINE_AFTER_S, NO_GREETING_S, AnsweringMachineDetector, Decision

log = logging.getLogger("duplex_agent.livekit")

#: The longest a machine's greeting is waited out for its beep before the call is ended anyway.
GREETING_LIMIT_S = 30.0


class VoicemailScreen:
    """Fed the caller's audio (``push``, on the call's loop); ``decided`` and ``greeting_over`` wait on it."""

    def __init__(self) -> None:
        self.detector = AnsweringMachineDetector(48000)
        self._decided = asyncio.Event()
        self._greeting_over = asyncio.Event()

    def push(self, samples: np.ndarray, rate: int) -> None:
        if rate != 48000:  # the room's audio comes at 48 kHz; another rate would need its own detector
            return
        self.detector.push(samples)
        if self.detector.decision is not None:
            self._decided.set()
        if self.detector.greeting_over_at_s is not None:
            self._greeting_over.set()

    async def decided(self) -> Decision | None:
        """The decision, or None if the audio stopped coming (the call ended) before one."""
        try:
            await asyncio.wait_for(self._decided.wait(), NO_GREETING_S + MACHINE_AFTER_S + 5.0)
        except TimeoutError:
            return None
        decision = self.detector.decision
        if decision is not None:
            metrics.AMD_DECISIONS.labels(decision.verdict.value).inc()
        return decision

    async def greeting_over(self) -> bool:
        try:
            await asyncio.wait_for(self._greeting_over.wait(), GREETING_LIMIT_S)
        except TimeoutError:
            return False
        return True
