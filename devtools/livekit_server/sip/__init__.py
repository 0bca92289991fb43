"""LiveKit's SIP service, as the loopback server approximates it (see docs/testing.md):
outbound trunks, calls to scripted phones over a modelled phone line, transfers."""

from .far_end import CallRecord, Heard, KeyEvent
from .phones import Answer, Phone, SipStatus
from .service import SipService, Transfer

__all__ = ["Answer", "CallRecord", "Heard", "KeyEvent", "Phone", "SipService", "SipStatus", "Transfer"]
