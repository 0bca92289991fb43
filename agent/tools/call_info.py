"""The call a tool runs in, as its transport describes it to the tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from duplex_agent.agent.tools.call_control import CallControl


@dataclass(frozen=True, slots=True)
class CallInfo:
    #: The transport's own object: the ``livekit.rtc.Room`` of a LiveKit call, the ``PeerSession``
    #: of a direct WebRTC call.
    call: Any
    #: Who is calling: the LiveKit participant's identity, or the direct peer's id.
    caller_identity: str
    control: CallControl
