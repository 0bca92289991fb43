"""The phones the loopback SIP service can call, by number, and how each behaves.

A phone rings, then answers, is busy, declines, is unavailable or never answers; the SIP
status it ends an unanswered call with is the one a carrier would send back (486, 603,
480). A phone that answers may say a greeting at once (a person's "Hello?", a voicemail
box's greeting and beep) and hang up a set time after answering; the rest of what it says,
the keys it presses and its hang-up are driven by the test through the call (``FarEndCall``).
As a transfer target a phone accepts the REFER or refuses it with its status.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

import numpy as np


class Answer(enum.Enum):
    ANSWER = "answer"
    BUSY = "busy"  # 486 Busy Here
    DECLINE = "decline"  # 603 Decline
    UNAVAILABLE = "unavailable"  # 480 Temporarily Unavailable
    NO_ANSWER = "no_answer"  # rings until the ringing timeout


@dataclass(frozen=True)
class SipStatus:
    code: int
    status: str


#: The final response a phone that does not answer sends, per behaviour.
REFUSALS = {
    Answer.BUSY: SipStatus(486, "Busy Here"),
    Answer.DECLINE: SipStatus(603, "Decline"),
    Answer.UNAVAILABLE: SipStatus(480, "Temporarily Unavailable"),
}
#: What the far end answers for a number no phone has.
NOT_FOUND = SipStatus(404, "Not Found")

#: A number as the trunk is given it: E.164 (``+15551234567``), or a ``tel:`` / ``sip:`` URI holding one.
_NUMBER = re.compile(r"^(?:tel:|sips?:)?(\+?[0-9*#]+)(?:@.*)?$")


def number_of(target: str) -> str:
    """The dialled number in a ``sip_call_to`` or transfer target (``tel:+1555...``, ``sip:+1555...@host``)."""
    match = _NUMBER.match(target.strip())
    return match.group(1) if match else target.strip()


@dataclass
class Phone:
    """How the phone at one number behaves."""

    answer: Answer = Answer.ANSWER
    #: Seconds from the INVITE to the first ring (180 Ringing).
    ring_after_s: float = 0.2
    #: Seconds it rings before it answers or refuses (a NO_ANSWER phone rings on).
    rings_for_s: float = 1.0
    #: 48 kHz float32 audio it says as soon as it answers (a greeting), if any.
    greeting: np.ndarray | None = None
    #: Seconds after answering that it hangs up by itself (None: only when the test says so),
    #: e.g. in the middle of a greeting, its own or the agent's.
    hangs_up_after_s: float | None = None
    #: Line noise under everything it sends, dBFS (None: a clean line).
    noise_dbfs: float | None = None
    #: As a transfer target: None accepts the REFER; a status refuses it.
    refuses_transfer: SipStatus | None = None
    #: Its name in the room, as a trunk's caller ID would show it.
    name: str = ""
    extra: dict[str, str] = field(default_factory=dict)


class PhoneBook:
    """Numbers the loopback SIP service can reach; any other number is 404 Not Found."""

    def __init__(self) -> None:
        self._phones: dict[str, Phone] = {}

    def add(self, number: str, phone: Phone) -> None:
        self._phones[number_of(number)] = phone

    def get(self, target: str) -> Phone | None:
        return self._phones.get(number_of(target))
