"""Turn detection for callers on a phone line.

A SIP bridge brings the caller as 8 kHz G.711 speech (300-3400 Hz), then Opus. Silero, trained
on wideband speech, scores such speech lower and less steadily: what it says of a word depends
on the network's state after the line's digital silence, so at the wideband threshold a short
phrase ("That's all, thanks.") now and then never starts a turn, and the caller waits on an
agent that did not hear them. A phone caller's turn detection starts speech at a lower
probability; ``bench.phone_audio`` measures what that does to false pauses beside wideband.
"""

from __future__ import annotations

from typing import Any

#: Silero probability at which a phone caller's speech starts (the wideband default is 0.5).
PHONE_VAD_THRESHOLD = 0.3


def phone_turn_detection() -> dict[str, Any]:
    """The ``turn_detection`` session setting for a caller on a phone line."""
    return {"type": "server_vad", "threshold": PHONE_VAD_THRESHOLD}


def caller_turn_detection(on_phone_line: bool, chosen: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A caller's ``turn_detection``: the one chosen for the call where there is one, else the
    phone line's for a caller on a phone line, else None (the session's default)."""
    if chosen is not None or not on_phone_line:
        return chosen
    return phone_turn_detection()
