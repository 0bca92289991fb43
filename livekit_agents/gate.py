"""The adapter's audio gate, driven by our response boundaries instead of the audio's energy."""

from __future__ import annotations

from livekit import rtc


class ResponseGate:
    """Open while the frame handed over carries a response's audio: one burst is one response.

    The session sets ``open_for`` just before it yields each frame and the adapter asks
    ``update`` for that very frame, so the gate never guesses: a cut (the next frame is
    silence) closes the burst, and a new response opens a new one.
    """

    def __init__(self) -> None:
        self.open_for: str | None = None  # the response whose audio the next frame carries

    def update(self, frame: rtc.AudioFrame) -> bool:
        return self.open_for is not None

    def deactivate(self) -> None:
        """The adapter ended the burst; the next response's first frame opens the next one."""
