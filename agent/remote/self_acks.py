"""Playback acks this side sends for a transport that does not send its own.

vLLM-Omni 0.30.0 keeps a reply active until its playback is acknowledged (whatever policy the
client asks for, its session runner sets ``ack_only``), so a transport that never sends ``playback.ack``
would get ``response_already_active`` on its next turn. This side therefore
acknowledges every reply the transport has not: when its audio has had time to
play out, or at once before the transport's next ``response.create`` or commit,
with what the caller can have heard by then.

Under ``ack_only`` vLLM-Omni counts its latest reply as still playing while the acknowledged
playback is short of the audio it sent: new input is then overlap, and a commit is only
recorded, never answered. Only a full ack or a cancel frees the turn. So an ack of ours
that commits less than a finished reply is followed by ``output_audio_buffer.clear``, the
cancel that keeps the caller's buffered input (``barge_in`` drops it, ``response.cancel``
refuses a finished reply) and commits the history at the acknowledged point. A transport's
own ack is passed on as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote import client_events
from duplex_agent.agent.remote.answers import ExpectedAnswers, error_code
from duplex_agent.agent.remote.responses import RecentIds, ServerResponses
from duplex_agent.agent.remote.session import RemoteSession

log = logging.getLogger("duplex_agent.remote")

#: After a reply's audio should have played out, how long to wait for the transport's own ack.
SELF_ACK_MARGIN_S = 0.5
#: Replies tracked at most; the oldest is forgotten (never acknowledged from here) beyond it.
_MAX_UNACKED = 64


def real_time_heard_ms(received_ms: float, first_at: float, now: float) -> float:
    """What a caller playing a reply in real time since its first audio arrived (at ``first_at``) can
    have heard of the ``received_ms`` that arrived, by ``now``."""
    return min(received_ms, 1000.0 * (now - first_at))


@dataclass(slots=True)
class _Playback:
    """A reply's audio as received, for acknowledging it when the transport does not."""

    item_id: str
    first_at: float
    received_ms: float = 0.0
    done: bool = False
    timer: asyncio.TimerHandle | None = None

    def heard_ms(self, now: float) -> float:
        return real_time_heard_ms(self.received_ms, self.first_at, now)


class SelfAcks:
    """The replies with audio that the transport has not acknowledged, and the acks owed for them.

    ``queue`` sends what a timer decides (an ack once a finished reply has had time to play out);
    what is owed before the transport's next turn comes from ``owed``, sent ahead of that turn.
    """

    def __init__(self, remote: RemoteSession, responses: ServerResponses, answers: ExpectedAnswers,
                 queue: Callable[[list[dict[str, Any]]], None]) -> None:
        self._remote = remote
        self._responses = responses
        self._answers = answers
        self._queue = queue
        self._unacked: dict[str, _Playback] = {}
        self._cleared = RecentIds()  # finished replies this side cleared after a partial ack
        self._sent = 0
        self._stopped = False

    def heard(self, event: p.ResponseAudioDelta) -> None:
        """Audio of a reply arrived (for the transport to play)."""
        # vLLM-Omni 0.30.0 holds a reply active until it is acknowledged under any policy asked for
        # (its DuplexSessionRunner.start sets ack_only on every session).
        if self._stopped or not self._remote.capabilities.supports_playback_ack:
            return
        playback = self._unacked.get(event.response_id)
        if playback is None:
            playback = self._unacked[event.response_id] = _Playback(event.item_id, time.monotonic())
            while len(self._unacked) > _MAX_UNACKED:
                self._take(next(iter(self._unacked)))
        playback.received_ms = max(playback.received_ms, event.audio_start_ms + event.audio_ms)

    def ended(self, response_id: str) -> None:
        """The reply is done: acknowledge it once its audio has had time to play, unless the transport does."""
        playback = self._unacked.get(response_id)
        if playback is None or playback.done:
            return
        playback.done = True
        now = time.monotonic()
        delay = max(0.0, playback.first_at + playback.received_ms / 1000.0 - now) + SELF_ACK_MARGIN_S
        playback.timer = asyncio.get_running_loop().call_later(delay, self._ack_when_played, response_id)

    def acked_by_transport(self, response_id: str) -> None:
        """The transport speaks for this reply: no ack from here."""
        self._take(response_id)

    def owed(self) -> list[dict[str, Any]]:
        """Acks for every finished reply the transport left unacknowledged, to go out before its next turn."""
        done = [response_id for response_id, playback in self._unacked.items() if playback.done]
        return [message for response_id in done for message in self._ack(response_id)]

    def is_own_clear(self, event: p.OutputAudioBufferCleared) -> bool:
        """The answer to this side's ``output_audio_buffer.clear``: the transport's own playout goes on."""
        return event.response_id in self._cleared

    def stop(self) -> None:
        """The conversation is ending: nothing more is acknowledged from here."""
        self._stopped = True
        for response_id in list(self._unacked):
            self._take(response_id)

    def _ack_when_played(self, response_id: str) -> None:
        if not self._stopped and response_id in self._unacked:
            self._queue(self._ack(response_id))

    def _ack(self, response_id: str) -> list[dict[str, Any]]:
        """The ack of what the caller can have heard by now, and the clear that frees a short-acked turn."""
        playback = self._take(response_id)
        if playback is None:
            return []
        heard = round(playback.heard_ms(time.monotonic()))
        # A reply the edge cut is always truncated where the server can.
        truncate = heard < playback.received_ms or response_id in self._responses.cut
        message = client_events.ack(response_id, playback.item_id, heard, heard, truncate=truncate,
                                    caps=self._remote.capabilities, event_id=self._expect_answer())
        return [message, *self._clear_partly_heard(response_id, playback, heard)]

    def _clear_partly_heard(self, response_id: str, playback: _Playback, committed_ms: float) -> list[dict[str, Any]]:
        """``output_audio_buffer.clear`` after an ack short of a finished reply's audio, so vLLM-Omni
        frees the turn (see the module docstring). Only for the latest reply: a newer one owns the
        server's playback, and a cut one was freed by its cancel."""
        if (not self._remote.extended or not playback.done
                or committed_ms >= playback.received_ms or response_id in self._responses.cut
                or response_id != self._responses.latest):
            return []
        self._cleared.add(response_id)
        return [{"type": "output_audio_buffer.clear", "event_id": self._expect_answer()}]

    def _expect_answer(self) -> str:
        """A fresh ``event_id`` for a message sent for the transport: an error answering it stays here."""
        self._sent += 1
        event_id = f"evt_self_ack_{self._sent}"
        self._answers.expect(event_id, self._refused)
        return event_id

    def _refused(self, error: dict[str, Any]) -> bool:
        log.info("session %s: the server refused an ack sent for the transport: %s", self._remote.session_id,
                 error_code(error))
        return True

    def _take(self, response_id: str) -> _Playback | None:
        playback = self._unacked.pop(response_id, None)
        if playback is not None and playback.timer is not None:
            playback.timer.cancel()
        return playback
