"""The caller's echo of the agent, cancelled at the worker: WebRTC's audio processing module (AEC3)
through livekit's ``rtc.AudioProcessingModule``.

A speakerphone caller's microphone carries the agent's own voice back, late and coloured by the
room. Silero scores that echo as speech, so without this the agent pauses and interrupts itself
on its own words. The worker knows exactly what it played: every frame out is the far-end
reference (``far_end``), every caller frame the near end (``near_end``), cleaned before the onset
detector, the barge-in gate and the model hear it. AEC3 finds the delay between the two itself
(the call's RTT, both jitter buffers and the room), and follows it when the path changes.

AEC3 starts out assuming echo: until it has heard the agent through the caller's room, it also
suppresses the caller's own voice over the agent's, so a caller with no echo at all is heard late
when they interrupt early in a call. That is why the transports leave it off unless asked
(``--echo-cancel``).

The module takes 10 ms frames of int16: the caller's frames are cut into 10 ms blocks (a 20 ms
frame is two, so nothing is held back), and a remainder waits for the next frame. The livekit
package is the ``livekit`` extra: without it ``available()`` is False and calls go uncancelled.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

BLOCK_MS = 10


def available() -> bool:
    """Whether livekit's audio processing module can be loaded here."""
    try:
        from livekit import rtc  # noqa: F401
    except ImportError:
        return False
    return True


class EchoCanceller:
    """One call's canceller. ``far_end`` and ``near_end`` may run on different threads."""

    def __init__(self) -> None:
        from livekit import rtc

        self._rtc = rtc
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True)
        self._lock = threading.Lock()  # the pacing side may feed the far end from its own thread
        self._near_rest = np.zeros(0, np.int16)
        self._near_rate = 0
        self._far_rest = np.zeros(0, np.int16)
        self._far_rate = 0

    def far_end(self, frame: np.ndarray, sample_rate: int) -> None:
        """What the caller was sent (int16 mono): the reference the echo is cancelled against."""
        if sample_rate != self._far_rate:
            self._far_rest, self._far_rate = np.zeros(0, np.int16), sample_rate
        audio = np.concatenate([self._far_rest, np.asarray(frame, np.int16).reshape(-1)])
        block = sample_rate * BLOCK_MS // 1000
        whole = audio.size - audio.size % block
        self._far_rest = audio[whole:]
        with self._lock:
            for at in range(0, whole, block):
                self._apm.process_reverse_stream(self._frame(audio[at:at + block], sample_rate))

    def near_end(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """The caller's audio (float32 mono) with the agent's echo taken out; whole 10 ms blocks
        of it (a remainder comes out with the next call)."""
        if sample_rate != self._near_rate:
            self._near_rest, self._near_rate = np.zeros(0, np.int16), sample_rate
        pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
        audio = np.concatenate([self._near_rest, pcm]) if self._near_rest.size else pcm
        block = sample_rate * BLOCK_MS // 1000
        whole = audio.size - audio.size % block
        self._near_rest = audio[whole:]
        out = np.empty(whole, np.float32)
        with self._lock:
            for at in range(0, whole, block):
                frame = self._frame(audio[at:at + block], sample_rate)
                self._apm.process_stream(frame)
                out[at:at + block] = np.frombuffer(frame.data, np.int16) / 32768.0
        return out

    def _frame(self, block: np.ndarray, sample_rate: int) -> Any:
        return self._rtc.AudioFrame(block.tobytes(), sample_rate, 1, block.size)
