"""Room state: participants, participant updates, track fan-out and data relay."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from livekit.protocol import models, rtc

from .ids import new_sid
from .media_relay import ForwardingRecord

if TYPE_CHECKING:
    from .participant import Participant, PublishedTrack

log = logging.getLogger(__name__)

_AGENT = models.ParticipantInfo.Kind.AGENT


class Room:
    def __init__(
        self,
        name: str,
        *,
        on_closed: Callable[[Room], Awaitable[None]],
        forwarding: ForwardingRecord,
        departure_timeout: float = 1.0,
        metadata: str = "",
    ) -> None:
        self.name = name
        self.sid = new_sid("RM_")
        self.metadata = metadata
        self.created_at = time.time()
        self.participants: dict[str, Participant] = {}  # identity -> participant
        self.closed = False
        self.ever_joined = False
        self._on_closed = on_closed
        self._departure_timeout = departure_timeout
        self._close_timer: asyncio.Task | None = None
        self.forwarding = forwarding  # the server's, shared by its rooms

    def info(self) -> models.Room:
        return models.Room(
            sid=self.sid,
            name=self.name,
            metadata=self.metadata,
            empty_timeout=300,
            departure_timeout=int(self._departure_timeout),
            creation_time=int(self.created_at),
            creation_time_ms=int(self.created_at * 1000),
            num_participants=len(self.participants),
            num_publishers=sum(1 for p in self.participants.values() if p.tracks),
        )

    def visible(self, exclude: Participant | None = None) -> list[Participant]:
        return [p for p in self.participants.values() if p is not exclude and not p.hidden]

    def find_track(self, track_sid: str) -> PublishedTrack | None:
        for p in self.participants.values():
            if track_sid in p.tracks:
                return p.tracks[track_sid]
        return None

    # -- membership -------------------------------------------------------
    async def add_participant(self, p: Participant) -> Participant | None:
        """Adds p; returns a previous participant with the same identity (to be kicked)."""
        old = self.participants.get(p.identity)
        self.participants[p.identity] = p
        self.ever_joined = True
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        return old

    async def announce(self, p: Participant) -> None:
        """After the JoinResponse: tell others, and subscribe p to existing tracks."""
        await self.broadcast_participant(p)
        if p.options.auto_subscribe and p.info.permission.can_subscribe:
            for other in self.visible(exclude=p):
                for pt in other.tracks.values():
                    p.subscribe(pt)
        p.announced.set()

    async def remove_participant(
        self, p: Participant, reason: int = models.DisconnectReason.CLIENT_INITIATED
    ) -> None:
        if self.participants.get(p.identity) is not p:
            await p.close()
            return
        del self.participants[p.identity]
        for other in self.participants.values():
            for sid in list(p.tracks):
                other.unsubscribe(sid)
        await p.close()
        p.info.state = models.ParticipantInfo.State.DISCONNECTED
        p.info.disconnect_reason = reason
        p.bump_version()
        if not p.hidden:
            await self._send_update([p.info])
        self._maybe_schedule_close()

    def _maybe_schedule_close(self) -> None:
        if self.closed or not self.ever_joined:
            return
        humans = [p for p in self.participants.values() if p.kind != _AGENT]
        if not self.participants:
            self._schedule_close(0)
        elif not humans:
            self._schedule_close(self._departure_timeout)

    def _schedule_close(self, delay: float) -> None:
        if self._close_timer is not None and not self._close_timer.done():
            return

        async def _later() -> None:
            await asyncio.sleep(delay)
            self._close_timer = None
            await self.close(models.DisconnectReason.ROOM_CLOSED)

        self._close_timer = asyncio.create_task(_later(), name="lk-room-close")

    async def close(self, reason: int = models.DisconnectReason.ROOM_DELETED) -> None:
        if self.closed:
            return
        self.closed = True
        if self._close_timer is not None and self._close_timer is not asyncio.current_task():
            self._close_timer.cancel()
        leave = rtc.SignalResponse(
            leave=rtc.LeaveRequest(
                can_reconnect=False, reason=reason, action=rtc.LeaveRequest.Action.DISCONNECT
            )
        )
        members = list(self.participants.values())
        self.participants.clear()
        await asyncio.gather(*(p.send(leave) for p in members), return_exceptions=True)
        await asyncio.gather(*(p.close() for p in members), return_exceptions=True)
        await self._on_closed(self)

    # -- updates ----------------------------------------------------------
    async def _send_update(self, infos: list[models.ParticipantInfo]) -> None:
        msg = rtc.SignalResponse(update=rtc.ParticipantUpdate(participants=infos))
        await asyncio.gather(
            *(p.send(msg) for p in list(self.participants.values())), return_exceptions=True
        )

    async def broadcast_participant(self, p: Participant) -> None:
        if p.hidden:
            await p.send(rtc.SignalResponse(update=rtc.ParticipantUpdate(participants=[p.info])))
        else:
            await self._send_update([p.info])

    async def on_track_published(self, publisher: Participant, pt: PublishedTrack) -> None:
        await self.broadcast_participant(publisher)
        if publisher.hidden:
            return
        for p in self.visible(exclude=publisher) + [
            x for x in self.participants.values() if x.hidden and x is not publisher
        ]:
            if p.options.auto_subscribe and p.info.permission.can_subscribe:
                p.subscribe(pt)

    async def on_track_unpublished(self, publisher: Participant, pt: PublishedTrack) -> None:
        for p in self.participants.values():
            p.unsubscribe(pt.info.sid)
        await self.broadcast_participant(publisher)

    # -- data -------------------------------------------------------------
    def relay_data(self, sender: Participant, raw: bytes, reliable: bool) -> None:
        pkt = models.DataPacket()
        try:
            pkt.ParseFromString(raw)
        except Exception:
            log.warning("undecodable data packet from %s", sender.identity)
            return
        # As LiveKit's SFU: the sender's identity is asserted, except that an agent may
        # open a text stream on behalf of another participant (transcriptions).
        on_behalf = (
            pkt.WhichOneof("value") == "stream_header"
            and sender.info.kind == models.ParticipantInfo.Kind.AGENT
            and pkt.participant_identity not in ("", sender.identity)
        )
        if on_behalf:
            if pkt.stream_header.WhichOneof("content_header") == "text_header":
                pkt.stream_header.text_header.generated = True
        else:
            pkt.participant_identity = sender.identity
        pkt.participant_sid = sender.sid
        dests = set(pkt.destination_identities)
        if pkt.WhichOneof("value") == "user":
            pkt.user.participant_identity = sender.identity
            pkt.user.participant_sid = sender.sid
            dests |= set(pkt.user.destination_identities)
        sender.data_sent.append(pkt)
        data = pkt.SerializeToString()
        for p in list(self.participants.values()):
            if p is sender or (dests and p.identity not in dests):
                continue
            p.send_data(data, reliable)
