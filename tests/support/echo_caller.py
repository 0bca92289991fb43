"""A speakerphone caller's microphone: its own speech plus the echo of what it heard.

A ``next_frame`` source for an aiortc test peer (``tests.webrtc.client_peer.ClientPeer``) or any
paced loop: ``say`` queues the caller's own speech, and ``listen_to`` hands it the list the peer
appends the agent's received frames to (float32, 48 kHz). Each frame it sends carries the speech
due now plus the echo (``EchoPath``) of the frames received so far, as a loudspeaker beside the
microphone would put it there. The agent's audio is played as it arrives: the peer's own receive
buffer is the loudspeaker's.
"""

from __future__ import annotations

import numpy as np

from tests.support.echo import EchoPath

FRAME = 960  # 20 ms at 48 kHz


class EchoMicrophone:
    def __init__(self, echo: EchoPath | None) -> None:
        self.echo = echo  # None: a headset, no echo at all
        self._speech = np.zeros(0, np.float32)
        self._heard: list[np.ndarray] = []
        self._played = 0  # of the heard frames, those already on the loudspeaker
        self.echo_energy = 0.0  # sum of squares of the echo sent (a test checks it was there)

    def listen_to(self, heard: list[np.ndarray]) -> None:
        """The frames the caller receives, as its peer appends them."""
        self._heard, self._played = heard, len(heard)

    def say(self, audio48k: np.ndarray) -> None:
        self._speech = np.concatenate([self._speech, np.asarray(audio48k, np.float32)])

    @property
    def busy(self) -> bool:
        """Own speech is still to be sent."""
        return self._speech.size > 0

    def next_mono(self) -> np.ndarray:
        """The next 20 ms the microphone picks up, float32."""
        frame = np.zeros(FRAME, np.float32)
        speech, self._speech = self._speech[:FRAME], self._speech[FRAME:]
        frame[: speech.size] = speech
        if self.echo is not None:
            while self._played < len(self._heard):
                self.echo.play(self._heard[self._played])
                self._played += 1
            echo = self.echo.pick_up(FRAME)
            self.echo_energy += float(np.dot(echo, echo))
            frame += echo
        return frame

    def next_frame(self) -> np.ndarray:
        """The next 20 ms as int16, as a track sends it."""
        return (np.clip(self.next_mono(), -1, 1) * 32767).astype(np.int16)
