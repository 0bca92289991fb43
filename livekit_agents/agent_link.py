"""The ``AgentSession`` a duplex session runs in, found through livekit-agents' own hooks.

Inside a job it is the job context's session whose current agent's ``duplex_session`` is
ours; an app that builds sessions outside a job names it with ``DuplexModel.attach``.
Once found: our edge's pause and resume pause and resume its audio output, our edge's clear
interrupts it, its room output's ``playback_finished`` positions (read through
``playback_progressed``: room_segment.py) become our acks, and an interrupted assistant message is cut to the words
the caller heard, so the model's history and the session's chat context agree.

Where the heard text goes in (livekit-agents 1.8.9): an interrupted message's text is its
segment's ``_ForwardOutput.forwarded_text``, which is ``synchronized_transcript`` of the
``PlaybackFinishedEvent`` that the session output's ``wait_for_playout`` returns
(``voice/generation.py``), and that is the very event object ``playback_finished`` hands its
listeners just before (``voice/io.py``). Our listener sets that field, "the transcript synced
with playback", to the ledger's heard text, so the message is made with it and every
``conversation_item_added`` listener sees it. (The adapter's ``truncate`` is a no-op and its
``message_truncation`` False; no ``Agent`` hook sees the message before it is added.) A message
the session took as played in full though our edge cut it (``interrupt()`` refused) is cut in
place as it is added instead; a listener registered before ours sees its generated text.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents import llm
from livekit.agents.job import get_job_context
from livekit.agents.voice import agent_session as _agent_session_module

from duplex_agent.livekit_agents.room_segment import RoomSegment

if TYPE_CHECKING:
    from livekit.agents import AgentSession

log = logging.getLogger("duplex_agent.livekit_agents")


def _aec_warmup_left_at_default(session: AgentSession) -> bool:
    default = getattr(_agent_session_module, "_DEFAULT_AEC_WARMUP_DURATION", None)
    explicit = getattr(session, "_aec_warmup_duration_explicit", True)
    return not explicit and bool(session.options.aec_warmup_duration) and \
        session.options.aec_warmup_duration == default


@dataclass
class _Burst:
    """One generation of the adapter: its message, the response its audio carries, the room's view.

    One response is one burst, unless the adapter ended it for a frame that came 0.8 s late (a
    stalled loop): the response then goes on in a later burst, and each burst's message holds
    its own stretch of the words."""

    message_id: str
    response_id: str
    segment: RoomSegment
    from_ms: float = 0.0  # where its stretch of the response begins (after the bursts before it)
    after_end: bool = False  # an earlier burst of its response ended it (a cut, a skip)


class AgentSessionLink:
    """One duplex session's view of its AgentSession: interrupt, room positions, heard history."""

    def __init__(self, duplex: llm.DuplexSession, *, response_of_burst: Callable[[], str | None],
                 on_room_played: Callable[[str, float, bool, float], str | None]) -> None:
        self._duplex = duplex
        self._response_of_burst = response_of_burst
        self._on_room_played = on_room_played
        self.session: AgentSession | None = None
        self._bursts: deque[_Burst] = deque()  # in playback order
        self._last_response: str | None = None  # the response of the newest burst
        #: the response the newest burst goes on with, once an earlier burst of it ended
        self.reopened: str | None = None
        self._heard: dict[str, str] = {}  # message id -> what the caller heard of it, once cut
        self.roomless = False  # the session runs without a room: no caller is ever linked

    def find(self, explicit: Iterable[AgentSession]) -> AgentSession | None:
        """The session running ``duplex`` now, else None (not started yet, or not ours)."""
        candidates = list(explicit)
        ctx = get_job_context(required=False)
        primary = getattr(ctx, "_primary_agent_session", None) if ctx is not None else None
        if primary is not None:
            candidates.append(primary)
        for session in candidates:
            try:
                if session.current_agent.duplex_session is self._duplex:
                    return session
            except RuntimeError:  # not running yet, or not on a duplex model
                continue
        return None

    def linked_caller(self, explicit: Iterable[AgentSession]) -> rtc.RemoteParticipant | None:
        """The participant the session's room input listens to, once it has linked one (and
        ``roomless`` once the session is found to have no room, so none will ever be)."""
        session = self.session or self.find(explicit)
        if session is None:
            return None
        try:
            return session.room_io.linked_participant
        except RuntimeError:  # a session started without a room
            self.roomless = True
            return None

    def connect(self, session: AgentSession) -> None:
        self.session = session
        if _aec_warmup_left_at_default(session):
            log.warning("AgentSession(aec_warmup_duration=...) is left at its default (%g s): for that long "
                        "after the agent starts speaking, the caller's audio reaches the model as silence, "
                        "so a barge-in then is never heard. Pass aec_warmup_duration=None with a DuplexModel.",
                        session.options.aec_warmup_duration)
        session.current_agent.realtime_llm_session.on("generation_created", self._on_generation_created)
        session.on("conversation_item_added", self._on_item_added)
        if session.output.audio is not None:
            session.output.audio.on("playback_progressed", self._on_playback_progressed)
            session.output.audio.on("playback_finished", self._on_playback_finished)

    def interrupt(self) -> bool:
        """``AgentSession.interrupt()``; False where it refused (or no session is found)."""
        if self.session is None:
            return False
        try:
            self.session.interrupt()
        except RuntimeError as exc:  # closing, or the speech playing does not allow interruptions
            log.debug("AgentSession.interrupt() refused: %s", exc)
            return False
        return True

    def pause_output(self) -> bool:
        """Pause the session's audio output (our edge paused); False where it cannot pause."""
        output = self.session.output.audio if self.session is not None else None
        if output is None or not output.can_pause:
            return False
        output.pause()
        return True

    def resume_output(self) -> None:
        output = self.session.output.audio if self.session is not None else None
        if output is not None:
            output.resume()

    def frame_handed(self, response_id: str, duration_s: float, response_played_ms: float) -> None:
        """A frame of ``response_id`` went to the adapter inside its burst."""
        if self._bursts and self._bursts[-1].response_id == response_id:
            self._bursts[-1].segment.frame_handed(duration_s, response_played_ms)

    def _on_generation_created(self, ev: llm.GenerationCreatedEvent) -> None:
        # the adapter opens a burst while our gate reports the response its frame carries
        response_id = self._response_of_burst()
        log.debug("AgentSession opened generation %s for response %s", ev.response_id, response_id)
        if ev.response_id and response_id is not None:
            if response_id == self._last_response:
                self.reopened = response_id
            self._last_response = response_id
            self._bursts.append(_Burst(ev.response_id, response_id, RoomSegment()))

    def _on_playback_progressed(self, ev: Any) -> None:
        if self._bursts:  # the room plays its segments in order: the oldest open one
            self._bursts[0].segment.progressed(ev.offset, ev.duration)

    def _on_playback_finished(self, ev: Any) -> None:
        if not self._bursts:
            return
        burst = self._bursts.popleft()
        later = [b for b in self._bursts if b.response_id == burst.response_id]
        heard_ms = burst.segment.heard_ms(ev.playback_position)
        # a stretch the room skipped (its queue dropped at a pause) was not heard: the heard text
        # ends where it began, as for a cut, though AgentSession takes the reply as played out
        cut = ev.interrupted or burst.segment.skipped
        if burst.after_end:
            heard: str | None = ""
        elif later and not cut:  # the response goes on in the next burst, which reports its end
            later[0].from_ms = heard_ms
            return
        else:
            for b in later:
                b.after_end = True
            heard = self._on_room_played(burst.response_id, heard_ms, cut, burst.from_ms)
        if heard is not None:
            # read next by the generation that waits for this playout: its message's text
            ev.synchronized_transcript = heard
            self._heard[burst.message_id] = heard

    def _on_item_added(self, ev: Any) -> None:
        item = ev.item
        heard = self._heard.pop(getattr(item, "id", ""), None)
        if heard is not None and isinstance(item, llm.ChatMessage) and item.role == "assistant" \
                and item.text_content != heard:
            # the same object is the agent's and the session's history entry
            item.content = [heard]
