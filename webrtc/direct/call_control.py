"""Call control of a direct WebRTC call: the agent can hang up; a phone's transfer and DTMF it cannot."""

from __future__ import annotations

from collections.abc import Callable

from duplex_agent.agent.tools.call_control import CallControlError

NEEDS_PHONE_CALL = "needs_phone_call"


class DirectCallControl:
    kind = "direct"

    def __init__(self, end_call: Callable[[str], None]) -> None:
        self._end_call = end_call

    async def hang_up(self, reason: str) -> None:
        """Close the peer connection (the page is told first, on its data channel)."""
        self._end_call(reason)

    async def transfer(self, to: str) -> None:
        raise CallControlError(NEEDS_PHONE_CALL, "a transfer needs a phone call; this caller is on a direct "
                               "WebRTC call, which has no line to transfer")

    async def send_dtmf(self, digits: str) -> None:
        raise CallControlError(NEEDS_PHONE_CALL, "DTMF needs a phone call; this caller is on a direct WebRTC call")
