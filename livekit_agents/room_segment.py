"""How far into a response the caller heard, from what AgentSession's room output reports.

The room output counts its own timeline per segment (one burst, one response): every frame
handed to it, the silence of an underrun or of our pause included. ``playback_progressed``
reports each stretch of it that played ("never revised"); a stretch that starts past the end
of the one before means audio was discarded unplayed: its source queue, dropped when its
output was paused (``_ParticipantAudioOutput._forward_audio``), is skipped, not replayed, on
resume. Heard is therefore the contiguous start of the segment, up to the first skip or the
end, mapped onto the response's own audio through the frames we handed over.
"""

from __future__ import annotations

from bisect import bisect_right

#: Two stretches closer than this are one (the room reports float seconds of resampled audio).
_CONTIGUOUS_S = 0.005


class RoomSegment:
    """One burst as the room output sees it: our frames in, its played stretches back."""

    def __init__(self) -> None:
        self._frame_ends_s: list[float] = []  # segment time at the end of each frame we handed over
        self._response_ms: list[float] = []  # the response's own audio played by the end of that frame
        self._heard_to_s: float | None = None  # end of the contiguous played start, once a stretch came
        self.skipped = False  # a stretch began past the end of the one before

    def frame_handed(self, duration_s: float, response_played_ms: float) -> None:
        end = (self._frame_ends_s[-1] if self._frame_ends_s else 0.0) + duration_s
        self._frame_ends_s.append(end)
        self._response_ms.append(response_played_ms)

    def progressed(self, offset_s: float, duration_s: float) -> None:
        """A ``playback_progressed`` stretch."""
        if self.skipped:
            return
        heard = self._heard_to_s or 0.0
        if offset_s > heard + _CONTIGUOUS_S:
            self.skipped = True
            return
        self._heard_to_s = max(heard, offset_s + duration_s)

    def heard_ms(self, playback_position_s: float) -> float:
        """The response's audio the caller heard without a gap: to the first skip, else to the
        room's ``playback_position`` (the one figure a sink that reports no stretches gives)."""
        return self._response_at(playback_position_s if self._heard_to_s is None else self._heard_to_s)

    def _response_at(self, segment_s: float) -> float:
        if not self._frame_ends_s or segment_s <= 0.0:
            return 0.0
        k = bisect_right(self._frame_ends_s, segment_s)
        if k >= len(self._frame_ends_s):
            return self._response_ms[-1]
        start_s = self._frame_ends_s[k - 1] if k else 0.0
        before = self._response_ms[k - 1] if k else 0.0
        share = (segment_s - start_s) / (self._frame_ends_s[k] - start_s)
        return before + share * (self._response_ms[k] - before)
