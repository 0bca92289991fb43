"""A speakerphone's acoustic echo: what a caller's loudspeaker plays comes back into its microphone,
late, coloured by the room and quieter.

``EchoPath`` takes the agent's audio as the caller played it, 20 ms at a time, and gives back the
echo its microphone picks up over the same 20 ms: delayed by ``delay_ms``, filtered by a room
impulse response (``room_response``: the direct sound, a few early reflections, then a decaying
noise tail) and scaled to ``level_db`` under what was played. ``change`` moves the path mid-call
(the caller walks away, turns the phone): a new delay, room and level from the next frame on.
"""

from __future__ import annotations

import numpy as np


def room_response(rate: int = 48000, *, tail_ms: float = 120.0, reflections: int = 4, seed: int = 0) -> np.ndarray:
    """A room's impulse response at ``rate``, unit energy: the direct sound, ``reflections`` early
    reflections within 30 ms, and a noise tail decaying 60 dB over ``tail_ms`` (a small, soft room)."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * tail_ms / 1000))
    response = np.zeros(n, np.float64)
    response[0] = 1.0
    for _ in range(reflections):
        at = int(rng.uniform(0.002, 0.03) * rate)
        if at < n:
            response[at] += rng.uniform(0.2, 0.6) * rng.choice((-1.0, 1.0))
    decay = np.exp(np.log(1e-3) * np.arange(n) / n)  # -60 dB at the end of the tail
    response += 0.15 * rng.standard_normal(n) * decay
    return (response / np.sqrt(np.sum(response**2))).astype(np.float32)


class EchoPath:
    """Loudspeaker -> room -> microphone for one caller, frame by frame (float32 at ``rate``)."""

    def __init__(self, *, delay_ms: float, level_db: float, response: np.ndarray | None = None,
                 rate: int = 48000) -> None:
        self.rate = rate
        self._line = np.zeros(0, np.float32)  # echo already made, not yet picked up
        self._tail = np.zeros(0, np.float32)  # the room's ring-out of what was played so far
        self.change(delay_ms=delay_ms, level_db=level_db, response=response)

    def change(self, *, delay_ms: float, level_db: float, response: np.ndarray | None = None) -> None:
        """From the next frame on, a new path. What is in flight keeps its old path; a longer delay
        opens a gap of silence, a shorter one drops the echo it skips (as a moved phone hears it)."""
        self.delay_ms, self.level_db = delay_ms, level_db
        self._gain = float(10 ** (level_db / 20))
        self._response = response if response is not None else room_response(self.rate)
        wanted = int(self.rate * delay_ms / 1000)
        if self._line.size < wanted:
            self._line = np.concatenate([np.zeros(wanted - self._line.size, np.float32), self._line])
        else:
            self._line = self._line[self._line.size - wanted:]

    def play(self, played: np.ndarray) -> None:
        """The loudspeaker played ``played`` (float32 at ``rate``): its echo is on its way."""
        played = np.asarray(played, np.float32).reshape(-1)
        wet = np.convolve(played, self._response).astype(np.float32) * self._gain
        wet[: self._tail.size] += self._tail[: wet.size]
        if self._tail.size > wet.size:  # a tail longer than this frame's own: carry the rest on
            wet = np.concatenate([wet, self._tail[wet.size:]])
        self._line = np.concatenate([self._line, wet[: played.size]])
        self._tail = wet[played.size:]

    def pick_up(self, samples: int) -> np.ndarray:
        """The next ``samples`` of echo the microphone hears (silence where none has arrived)."""
        out = np.zeros(samples, np.float32)
        taken = min(samples, self._line.size)
        out[:taken] = self._line[:taken]
        self._line = self._line[taken:]
        return out
