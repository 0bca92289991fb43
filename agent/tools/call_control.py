"""What a tool may do to the call itself: hang up, transfer, send DTMF.

Each transport gives its calls one ``CallControl``: a LiveKit room with a SIP caller does
all three through LiveKit's SIP service; a direct WebRTC call can only hang up. An action
the call cannot take raises ``CallControlError`` with a code and a sentence the model can
be told, and the call goes on.
"""

from __future__ import annotations

from typing import Protocol

#: The keys RFC 4733 carries.
DTMF_DIGITS = frozenset("0123456789*#ABCD")


class CallControlError(Exception):
    """An action the call could not take; ``str(exc)`` is a sentence fit for the model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class CallControl(Protocol):
    @property
    def kind(self) -> str:
        """``sip`` (a phone call through LiveKit's SIP bridge), ``livekit`` or ``direct``."""
        ...

    async def hang_up(self, reason: str) -> None:
        """End the call for the caller (remove them from the room, or close the peer connection)."""
        ...

    async def transfer(self, to: str) -> None:
        """Cold-transfer the caller to ``to`` (a ``tel:`` or ``sip:`` URI); CallControlError when refused."""
        ...

    async def send_dtmf(self, digits: str) -> None:
        """Send ``digits`` (of ``DTMF_DIGITS``) to the caller's line; CallControlError when it cannot."""
        ...
