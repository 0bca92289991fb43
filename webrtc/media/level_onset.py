"""The first sign of caller sound by its level alone, 10 ms at a time, for the barge-in pause.

Silero needs a whole 32 ms window, and scores the first windows of many speech onsets under the
pause threshold (the 75 ms "s" that opens "Sorry" scores under 0.3): those onsets paused the agent
windows after a bare echo peer's energy rule heard them (python -m bench.onset_delay). The level
rule hears them where that peer does: a 10 ms block over ``ONSET_DBFS`` that rises at least
``RISE_DB`` over the caller's background. It only pauses; whether the sound is speech (a
barge-in) or not (resume) is still Silero's to say (barge_in.py).

The background follows the caller's quietest recent level: it falls to any quieter block at once
and rises at most ``BACKGROUND_RISE_DB_PER_S``, so steady room noise or a hum is heard as an onset
once, when it starts, and not again; and only a block that follows one that was not loud is an
onset, so a sound that goes on is one onset, not one per block. A sound stays loud until it falls
``HYSTERESIS_DB`` under the rule, so noise that wavers around the rule is one onset too.
"""

from __future__ import annotations

import math

import numpy as np

#: Over this a block may be an onset: the bare echo peers' rule (an RMS of 0.01).
ONSET_DBFS = -40.0
#: How far over the caller's background a block must rise to be an onset.
RISE_DB = 15.0
#: How fast the background follows a louder caller (it follows a quieter one at once).
BACKGROUND_RISE_DB_PER_S = 6.0
#: How far under the rule a loud sound must fall before its next rise is an onset.
HYSTERESIS_DB = 6.0
BLOCK_MS = 10.0
_FLOOR_DB = -100.0  # digital silence counts as this, so the first sound after it is not infinitely far up


class LevelOnset:
    """One caller's level, block by block; ``push`` says whether a frame holds an onset."""

    def __init__(self) -> None:
        self.background_db: float | None = None
        self._loud = False  # the last block was over the rule
        self._rest = np.zeros(0, np.float32)  # a block's start left over from the last frame
        self._rest_rate = 0

    def push(self, samples: np.ndarray, sample_rate: int) -> bool:
        """Feed mono float32 audio; whether one of the 10 ms blocks it completed is an onset."""
        if sample_rate != self._rest_rate:
            self._rest, self._rest_rate = np.zeros(0, np.float32), sample_rate
        block = max(1, round(sample_rate * BLOCK_MS / 1000.0))
        audio = np.concatenate([self._rest, samples]) if self._rest.size else samples
        whole = audio.size - audio.size % block
        self._rest = audio[whole:].copy()
        if not whole:
            return False
        blocks = audio[:whole].reshape(-1, block)
        onset = False
        rise_per_block = BACKGROUND_RISE_DB_PER_S * BLOCK_MS / 1000.0
        for energy in np.einsum("ij,ij->i", blocks, blocks).tolist():  # a few blocks: scalar math is cheaper
            level = max(10.0 * math.log10(energy / block + 1e-12), _FLOOR_DB)
            background = level if self.background_db is None else self.background_db
            slack = HYSTERESIS_DB if self._loud else 0.0
            loud = level >= ONSET_DBFS - slack and level >= background + RISE_DB - slack
            onset = onset or (loud and not self._loud)
            self._loud = loud
            self.background_db = level if level < background else background + min(level - background, rise_per_block)
        return onset
