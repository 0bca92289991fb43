"""What this side wrote to a resumable server's socket and does not yet know the server has.

vLLM-Omni 0.30.0 resumes a dropped session by replaying the *server* events after the
client's ``last_received_server_event_seq``. It reports nothing about the *client* events it
got (there is no client sequence or ack), and its own ``DuplexClient`` resends none: what was
written into a socket that then died may have reached the session or not.

So every message written is kept here until a receipt covers it. A receipt is the answer to a
``session.heartbeat``: the server takes a socket's messages in order (vLLM-Omni: one command
mailbox per session; ours: one reader per socket) and answers each heartbeat with
``session.heartbeat_ack`` on its journaled stream, so acks come back in the order the
heartbeats went out and one lost with the socket comes back in the resume's replay. The k-th
ack therefore covers everything written up to the k-th heartbeat. Heartbeats go before and
after every control message and after every ``receipt_every_ms`` of audio.

After a resume, once the answers to everything the old socket delivered are in (the
connection waits for its resume probe's answer), what is still here is what the server does
not have, or may not have:
- everything from the first uncovered heartbeat on never reached it: sent again, in order;
- before that heartbeat lies at most one control message, or one stretch of audio, whose fate
  is unknown. The control message is sent again (a lost commit or ``response.create`` would
  leave the call waiting for a reply; a duplicate costs an error at most). The audio is dropped
  and counted in ``dropped_audio_ms``: repeated, it would put the same words into the model twice.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from duplex_agent.agent.remote.answers import ExpectedAnswers


class Role(Enum):
    AUDIO = "audio"
    CONTROL = "control"
    #: A ``session.heartbeat``: its ack is a receipt.
    RECEIPT = "receipt"
    #: Bookkeeping a resume makes stale (``session.event_ack``): never sent again.
    TRANSPORT = "transport"


@dataclass(slots=True)
class Outgoing:
    text: str
    audio_ms: float = 0.0
    role: Role | None = None

    def __post_init__(self) -> None:
        if self.role is None:
            self.role = Role.AUDIO if self.audio_ms > 0 else Role.CONTROL


class SentLog:
    """Messages written to the socket and not yet covered by a receipt, oldest first.

    ``answers``: where the receipts' ids are registered, so that an ``error`` answering one (a
    receipt too: the server took everything before it) comes here and not to the transport.
    """

    def __init__(self, receipt_every_ms: float = 200.0, answers: ExpectedAnswers | None = None) -> None:
        self.receipt_every_ms = receipt_every_ms
        self._answers = answers if answers is not None else ExpectedAnswers()
        self._written: deque[Outgoing] = deque()
        self._uncovered = False  # something that matters was written since the last heartbeat
        self._audio_since_receipt_ms = 0.0
        self._receipts = 0
        #: Audio of unknown fate at a resume, not sent again.
        self.dropped_audio_ms = 0.0
        #: Messages sent again after resumes.
        self.resent = 0

    def __len__(self) -> int:
        return len(self._written)

    def receipt_before(self, item: Outgoing) -> Outgoing | None:
        """A heartbeat to write before ``item``: a control message goes out with its fate decidable alone."""
        return self._receipt() if item.role is Role.CONTROL and self._uncovered else None

    def written(self, item: Outgoing) -> Outgoing | None:
        """Record ``item`` as written to the socket; a heartbeat to write after it, when one is due."""
        self._written.append(item)
        if item.role is Role.RECEIPT:
            self._uncovered = False
            self._audio_since_receipt_ms = 0.0
            return None
        if item.role is Role.TRANSPORT:
            return None
        self._uncovered = True
        self._audio_since_receipt_ms += item.audio_ms
        if item.role is Role.CONTROL or self._audio_since_receipt_ms >= self.receipt_every_ms:
            return self._receipt()
        return None

    def received(self) -> bool:
        """A heartbeat was answered: drop everything up to the oldest heartbeat here. False when none is here."""
        if not any(item.role is Role.RECEIPT for item in self._written):
            return False
        while self._written.popleft().role is not Role.RECEIPT:
            pass
        return True

    def after_resume(self) -> list[Outgoing]:
        """What to send again, in order, once the resumed session's answers to the old socket are in."""
        items = list(self._written)
        self._written.clear()
        self._uncovered = False
        self._audio_since_receipt_ms = 0.0
        lost_from = next((i for i, item in enumerate(items) if item.role is Role.RECEIPT), len(items))
        unknown, lost = items[:lost_from], items[lost_from:]
        self.dropped_audio_ms += sum(item.audio_ms for item in unknown)
        resend = [item for item in unknown if item.role is Role.CONTROL]
        resend += [item for item in lost if item.role in (Role.AUDIO, Role.CONTROL)]
        self.resent += len(resend)
        return resend

    def clear(self) -> None:
        """Stop tracking (the session can no longer be resumed)."""
        self._written.clear()
        self._uncovered = False

    def _receipt(self) -> Outgoing:
        self._receipts += 1
        event_id = f"evt_receipt_{self._receipts}"
        self._answers.expect(event_id, self._refused)
        return Outgoing(json.dumps({"type": "session.heartbeat", "event_id": event_id}), role=Role.RECEIPT)

    def _refused(self, error: dict[str, Any]) -> bool:
        """An ``error`` answering a receipt still covers what was written before it."""
        self.received()
        return True
