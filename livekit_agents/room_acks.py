"""``playback.ack`` at the room's playback position, not at our playout's.

Our playout hands frames to the room output, whose own queue plays them a little later;
when the caller cuts in, what they heard is what the room output reports in
``playback_finished.playback_position``. This wraps the conversation so that the call
audio path's acks wait for that position (bounded), and the model's history keeps only
what the caller heard. Without a room output attached, acks pass straight through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from duplex_agent.agent.protocol.events import ClientEvent, PlaybackAck, ResponseAudioDelta, ServerEvent
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.contract import DuplexCapabilities

#: How long an ack waits for the room's position before it goes out at our playout's.
ROOM_POSITION_WAIT_S = 2.0


class RoomAckedConversation:
    """A ``Conversation`` whose acks go out once the room output has said how far it played."""

    def __init__(self, conversation: Conversation, *,
                 on_audio_delta: Callable[[ResponseAudioDelta], None]) -> None:
        self.inner = conversation
        self._on_audio_delta = on_audio_delta
        self.room_attached = False
        self._held: dict[str, tuple[PlaybackAck, asyncio.TimerHandle]] = {}
        self._positions: dict[str, float] = {}  # response -> ms the room played, reported before its ack

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    @property
    def capabilities(self) -> DuplexCapabilities:
        return self.inner.capabilities

    def __getattr__(self, name: str):  # use_caller_vad, resumes: the inner conversation's own extras
        return getattr(self.inner, name)

    def send(self, event: ClientEvent) -> None:
        if not (isinstance(event, PlaybackAck) and event.response_id and self.room_attached):
            self.inner.send(event)
            return
        position = self._positions.pop(event.response_id, None)
        if position is not None:
            self._send_at(event, position)
            return
        timer = asyncio.get_running_loop().call_later(ROOM_POSITION_WAIT_S, self._release, event.response_id)
        self._held[event.response_id] = (event, timer)

    def room_played(self, response_id: str, played_ms: float) -> None:
        """The room output finished ``response_id`` after ``played_ms`` of it."""
        held = self._held.pop(response_id, None)
        if held is None:
            self._positions[response_id] = played_ms
            return
        held[1].cancel()
        self._send_at(held[0], played_ms)

    def _release(self, response_id: str) -> None:
        held = self._held.pop(response_id, None)
        if held is not None:
            self.inner.send(held[0])

    def _send_at(self, ack: PlaybackAck, room_ms: float) -> None:
        played = min(ack.played_ms, room_ms)
        self.inner.send(PlaybackAck(played_ms=played, response_id=ack.response_id, item_id=ack.item_id,
                                    committed_ms=None if ack.committed_ms is None else min(ack.committed_ms, played),
                                    truncate=ack.truncate))

    async def events(self) -> AsyncIterator[ServerEvent]:
        async for event in self.inner.events():
            if isinstance(event, ResponseAudioDelta) and event.marks:
                self._on_audio_delta(event)
            yield event

    async def close(self, reason: str = "client_closed") -> None:
        for response_id in list(self._held):
            self._release(response_id)
        await self.inner.close(reason)
