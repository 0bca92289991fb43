"""When Moshi holds the floor: from its text stream, frame by frame.

Moshi writes padding text tokens while it is silent and word tokens while it talks. It takes
the floor on its first word and yields after ``quiet_frames_to_yield`` frames without one
(10 frames = 800 ms, longer than the pauses between its words).
"""

from __future__ import annotations


class FloorTracker:
    def __init__(self, quiet_frames_to_yield: int = 10) -> None:
        if quiet_frames_to_yield < 1:
            raise ValueError("quiet_frames_to_yield must be at least 1")
        self.quiet_frames_to_yield = quiet_frames_to_yield
        self.speaking = False
        self._quiet = 0

    def push(self, has_word: bool) -> tuple[bool, bool]:
        """One frame -> (speaking after it, this frame ended the turn)."""
        if has_word:
            self.speaking = True
            self._quiet = 0
            return True, False
        if not self.speaking:
            return False, False
        self._quiet += 1
        if self._quiet >= self.quiet_frames_to_yield:
            self.speaking = False
            self._quiet = 0
            return False, True
        return True, False
