"""Answering-machine detection: a person or a voicemail box, from the first seconds of an
answered outbound call.

A person answers with a short greeting ("Hello?", "Yes, speaking") and then waits for the
caller; a voicemail box plays a long greeting with only short pauses between its sentences,
then a beep. So, from the greeting's first voiced frame: a pause of ``PAUSE_S`` before the
greeting has lasted ``MACHINE_AFTER_S`` is a person; a greeting still going at
``MACHINE_AFTER_S`` is a machine. A person who talks on for that long without a pause is taken
for a machine, the trade every greeting-length detector makes. After a machine, the detector
listens for the end of its greeting: the end of a beep (a steady tone of ``BEEP_MIN_S`` or
more), or, for a box without one, ``NO_BEEP_QUIET_S`` of quiet.

It works on the audio's own clock (the samples it is given), on 20 ms frames at 8 kHz, so a
decision depends only on the audio, never on the machine's load. Voice is a frame's level
above the line's noise (tracked as it goes) and above an absolute floor; a tone is a voiced
frame whose energy sits in one narrow band of the voice band. The line's noise is a low
percentile of the last seconds' frame levels: the quiet between words, which a long greeting
has too.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np
import soxr

RATE = 8000
FRAME = RATE // 50
#: A pause this long ends a person's greeting: they wait for the caller to speak.
PAUSE_S = 0.8
#: A greeting still going this long after it began is a machine's.
MACHINE_AFTER_S = 2.4
#: A steady tone this long is a beep; its end is the machine's cue to leave a message.
BEEP_MIN_S = 0.2
#: After a machine's greeting, this much quiet without a beep ends it all the same.
NO_BEEP_QUIET_S = 2.5
#: With nothing said this long after the answer, the far end is taken for a person who waits.
NO_GREETING_S = 5.0
#: Voice: this far above the line's noise, and above an absolute floor.
VOICE_OVER_NOISE_DB = 12.0
VOICE_FLOOR_DBFS = -50.0
#: The noise is this percentile of the levels of the last ``NOISE_WINDOW`` frames.
NOISE_PERCENTILE = 10
NOISE_WINDOW = 100
#: A tone: this share of a frame's energy within ``TONE_BAND_HZ`` of its strongest frequency.
TONE_SHARE = 0.7
TONE_BAND_HZ = 60.0
_FFT = 512


class Verdict(enum.Enum):
    HUMAN = "human"
    MACHINE = "machine"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: Seconds from the answer to the decision, and from the greeting's first voiced frame.
    at_s: float
    after_greeting_s: float
    reason: str


class AnsweringMachineDetector:
    """Feed it the called party's audio from the answer on (``push``); it decides once."""

    def __init__(self, rate: int = RATE) -> None:
        self._resampler = soxr.ResampleStream(rate, RATE, 1, dtype="float32") if rate != RATE else None
        self._pending = np.zeros(0, np.float32)
        self._frames = 0
        self._levels: deque[float] = deque(maxlen=NOISE_WINDOW)
        self._greeting_start: int | None = None  # frame index of the greeting's first voiced frame
        self._last_voiced: int | None = None
        self._tone_run = 0
        self._beep_seen = False
        self.decision: Decision | None = None
        #: Seconds from the answer to the end of a machine's greeting (its beep), once heard.
        self.greeting_over_at_s: float | None = None

    @property
    def now_s(self) -> float:
        return self._frames * FRAME / RATE

    def push(self, samples: np.ndarray) -> None:
        """The next audio (at the rate given), in order; decides as soon as the audio allows."""
        audio = np.asarray(samples, np.float32)
        if self._resampler is not None:
            audio = self._resampler.resample_chunk(audio)
        self._pending = np.concatenate([self._pending, audio])
        while self._pending.size >= FRAME:
            frame, self._pending = self._pending[:FRAME], self._pending[FRAME:]
            self._frame(frame)

    def _frame(self, frame: np.ndarray) -> None:
        level = 10 * np.log10(float(np.mean(frame.astype(np.float64) ** 2)) + 1e-12)
        self._levels.append(level)
        noise = float(np.percentile(self._levels, NOISE_PERCENTILE))
        voiced = level > max(noise + VOICE_OVER_NOISE_DB, VOICE_FLOOR_DBFS)
        index = self._frames
        self._frames += 1
        if voiced:
            if self._greeting_start is None:
                self._greeting_start = index
            self._last_voiced = index
        if self.decision is None:
            self._decide(index)
        elif self.decision.verdict is Verdict.MACHINE and self.greeting_over_at_s is None:
            self._listen_for_beep(frame, voiced, index)

    def _decide(self, index: int) -> None:
        if self._greeting_start is None:
            if self.now_s >= NO_GREETING_S:
                self._set(Verdict.HUMAN, "no greeting: someone who waits to be spoken to")
            return
        assert self._last_voiced is not None
        since_voice_s = (index - self._last_voiced) * FRAME / RATE
        length_s = (index - self._greeting_start + 1) * FRAME / RATE
        if since_voice_s >= PAUSE_S:
            self._set(Verdict.HUMAN, f"a {length_s - since_voice_s:.1f} s greeting, then a pause")
        elif length_s >= MACHINE_AFTER_S:
            self._set(Verdict.MACHINE, f"a greeting still going after {MACHINE_AFTER_S:g} s")

    def _set(self, verdict: Verdict, reason: str) -> None:
        start = (self._greeting_start or 0) * FRAME / RATE
        self.decision = Decision(verdict, self.now_s, self.now_s - start if self._greeting_start is not None else 0.0,
                                 reason)

    def _listen_for_beep(self, frame: np.ndarray, voiced: bool, index: int) -> None:
        if voiced and is_tone(frame):
            self._tone_run += 1
            if self._tone_run * FRAME / RATE >= BEEP_MIN_S:
                self._beep_seen = True
            return
        if self._beep_seen:  # the beep just ended: the box records from here
            self.greeting_over_at_s = self.now_s
            return
        self._tone_run = 0
        assert self._last_voiced is not None
        if (index - self._last_voiced) * FRAME / RATE >= NO_BEEP_QUIET_S:
            self.greeting_over_at_s = self.now_s


def is_tone(frame: np.ndarray) -> bool:
    """Most of the frame's energy in one narrow band inside the voice band: a beep, not a voice."""
    spectrum = np.abs(np.fft.rfft(frame * np.hanning(frame.size), _FFT)) ** 2
    freqs = np.fft.rfftfreq(_FFT, 1 / RATE)
    peak = int(np.argmax(spectrum))
    if not 300.0 <= freqs[peak] <= 3400.0:
        return False
    near = np.abs(freqs - freqs[peak]) <= TONE_BAND_HZ
    return float(spectrum[near].sum()) >= TONE_SHARE * float(spectrum.sum())
