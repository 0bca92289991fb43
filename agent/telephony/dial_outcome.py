"""Why an outbound call was not answered, in words an operator and a dashboard share.

A carrier says it with a SIP status; LiveKit passes that on (``SipCallError``), or says the
phone rang out (its ringing timeout) or that the request itself was wrong (an unknown
trunk, a token without the SIP grant). Each becomes one ``reason``.
"""

from __future__ import annotations

#: Every reason a call can end unanswered, for /metrics labels and room events.
REASONS = ("busy", "declined", "no_answer", "invalid_number", "unknown_trunk", "not_permitted", "invalid_request",
           "failed")

_BY_SIP_STATUS = {
    486: "busy", 600: "busy",
    603: "declined", 607: "declined", 608: "declined",
    408: "no_answer", 480: "no_answer", 487: "no_answer",
    404: "invalid_number", 484: "invalid_number", 604: "invalid_number",
}


def reason_of_sip_status(code: int) -> str:
    return _BY_SIP_STATUS.get(code, "failed")


class DialFailed(Exception):
    """An outbound call that was not answered; ``str(exc)`` says why in a sentence."""

    def __init__(self, reason: str, detail: str, *, sip_status: int | None = None) -> None:
        super().__init__(detail)
        if reason not in REASONS:
            raise ValueError(f"unknown dial failure reason {reason!r}")
        self.reason = reason
        self.sip_status = sip_status
