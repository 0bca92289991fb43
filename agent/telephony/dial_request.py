"""An outbound call to place: the number, the trunk and how to place it, as a job's metadata
carries it (``{"dial": {...}}``), so that the CLI, LiveKit's dispatch API and any app can start
one. Every field is checked here, before anything is dialled: a mistake is a
``DialRequestError`` whose message says what to fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from duplex_agent.agent.telephony.quiet_answer import DEFAULT_QUIET_ANSWER_S
from duplex_agent.plugins.contract.say import MAX_SAY_CHARS

#: E.164: a plus, a country code that does not start with 0, at most 15 digits in all.
E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
#: Keys dialled after the answer (RFC 4733's sixteen), and ``w``: wait half a second.
DIAL_KEYS = frozenset("0123456789*#ABCDw")
#: LiveKit's ring window when a request sets none.
DEFAULT_RINGING_TIMEOUT_S = 30.0
#: What to do when a machine answers an outbound call.
VOICEMAIL_POLICIES = ("", "hang_up", "leave_message")
#: The longest an answered call may be left quiet before the agent speaks.
MAX_QUIET_ANSWER_S = 60.0


class DialRequestError(ValueError):
    """A dial request that cannot be placed; ``str(exc)`` says what to fix."""


@dataclass(frozen=True, slots=True)
class DialRequest:
    #: The number to call, E.164 (``+15551234567``).
    number: str
    #: The LiveKit outbound trunk to call through (``ST_...``).
    trunk: str
    #: The number the call comes from (caller ID); empty: the trunk's own.
    caller_id: str = ""
    #: Keys dialled once the far end answers, e.g. an extension (``w`` waits half a second).
    dtmf: str = ""
    ringing_timeout_s: float = DEFAULT_RINGING_TIMEOUT_S
    #: The longest the call may last, from when it is placed; 0: no limit.
    max_duration_s: float = 0.0
    #: The agent speaks as soon as the far end answers, instead of waiting to be spoken to: it
    #: says ``greeting``, in the model's voice.
    agent_speaks_first: bool = False
    #: What the agent says first (``agent_speaks_first``, or into a quiet line).
    greeting: str = ""
    #: Answered, and no one speaks for this long: the agent speaks first (the greeting, or a
    #: short "Hello?"). 0: the agent waits to be spoken to.
    quiet_answer_s: float = DEFAULT_QUIET_ANSWER_S
    #: The called party's identity in the room; empty: LiveKit's ``sip_<number>``.
    identity: str = ""
    #: When voicemail answers: "" (treat it as a person), ``hang_up``, or ``leave_message``.
    voicemail: str = ""
    #: What ``leave_message`` says after the beep.
    voicemail_message: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not E164.match(self.number):
            problems.append(f"the number {self.number!r} is not an E.164 number such as +15551234567")
        if not self.trunk.strip():
            problems.append("no trunk: give the LiveKit outbound trunk id (ST_...)")
        if self.caller_id and not E164.match(self.caller_id):
            problems.append(f"the caller ID {self.caller_id!r} is not an E.164 number")
        bad_keys = sorted(set(self.dtmf) - DIAL_KEYS)
        if bad_keys:
            problems.append(f"DTMF may hold only 0-9 * # A-D and w (a pause), not {''.join(bad_keys)!r}")
        if not 1.0 <= self.ringing_timeout_s <= 80.0:
            problems.append(f"the ringing timeout must be 1-80 s, not {self.ringing_timeout_s:g}")
        if not 0.0 <= self.quiet_answer_s <= MAX_QUIET_ANSWER_S:
            problems.append(f"the quiet answer wait must be 0-{MAX_QUIET_ANSWER_S:g} s (0: never speak first), "
                            f"not {self.quiet_answer_s:g}")
        if self.max_duration_s < 0:
            problems.append("the maximum duration cannot be negative")
        if self.voicemail not in VOICEMAIL_POLICIES:
            problems.append(f"voicemail must be one of hang_up, leave_message, not {self.voicemail!r}")
        if self.voicemail == "leave_message" and not self.voicemail_message.strip():
            problems.append("voicemail leave_message needs the message to leave")
        if self.agent_speaks_first and not self.greeting.strip():
            problems.append("agent_speaks_first needs the greeting to say")
        for name, text in (("greeting", self.greeting), ("voicemail message", self.voicemail_message)):
            if len(text) > MAX_SAY_CHARS:
                problems.append(f"the {name} is over {MAX_SAY_CHARS} characters")
        if problems:
            raise DialRequestError("; ".join(problems))

    @property
    def participant_identity(self) -> str:
        return self.identity or f"sip_{self.number}"

    def to_metadata(self) -> str:
        """The job metadata that asks a worker to place this call."""
        return json.dumps({"dial": asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> DialRequest:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise DialRequestError(f"unknown dial fields: {', '.join(unknown)} (known: {', '.join(known)})")
        values: dict[str, Any] = {}
        for name, value in data.items():
            kind = known[name].type
            try:
                if kind == "str":
                    if not isinstance(value, str):
                        raise TypeError
                    values[name] = value
                elif kind == "float":
                    if isinstance(value, bool):
                        raise TypeError
                    values[name] = float(value)
                elif kind == "bool":
                    if not isinstance(value, bool):
                        raise TypeError
                    values[name] = value
            except (TypeError, ValueError):
                raise DialRequestError(f"dial field {name} must be a {kind}, not {value!r}") from None
        for required in ("number", "trunk"):
            if required not in values:
                raise DialRequestError(f"the dial request has no {required}")
        return cls(**values)


def dial_request_of(job_metadata: str) -> DialRequest | None:
    """The call a job's metadata asks for (``{"dial": {...}}``); None when it asks for none."""
    text = (job_metadata or "").strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or "dial" not in data:
        return None
    if not isinstance(data["dial"], dict):
        raise DialRequestError("the job's dial metadata must be an object of dial fields")
    return DialRequest.from_fields(data["dial"])
