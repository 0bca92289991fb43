"""Immutable snapshots of the server's state, taken on its loop for readers on other threads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from livekit.protocol import models

if TYPE_CHECKING:
    from .participant import Participant
    from .room import Room


@dataclass(frozen=True)
class TrackView:
    info: models.TrackInfo


@dataclass(frozen=True)
class SubscriptionView:
    track_sid: str
    disabled: bool


@dataclass(frozen=True)
class ParticipantView:
    info: models.ParticipantInfo
    tracks: Mapping[str, TrackView]  # track sid -> published
    subscriptions: Mapping[str, SubscriptionView]  # track sid -> subscription
    announced: bool  # the room told the others and made its subscriptions

    @property
    def identity(self) -> str:
        return self.info.identity


@dataclass(frozen=True)
class RoomView:
    name: str
    sid: str
    participants: Mapping[str, ParticipantView]  # identity -> participant


def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def participant_view(p: Participant) -> ParticipantView:
    return ParticipantView(
        info=_copy(p.info),
        tracks=MappingProxyType({sid: TrackView(_copy(pt.info)) for sid, pt in p.tracks.items()}),
        subscriptions=MappingProxyType({sid: SubscriptionView(sid, s.disabled)
                                        for sid, s in p.subscriptions.items()}),
        announced=p.announced.is_set(),
    )


def room_view(room: Room) -> RoomView:
    return RoomView(room.name, room.sid, MappingProxyType(
        {identity: participant_view(p) for identity, p in room.participants.items()}))


def record_copy(record):
    """A dispatcher record (worker, job, dispatch) as it stands, its containers copied."""
    changes = {f.name: type(v)(v) for f in dataclasses.fields(record)
               if isinstance(v := getattr(record, f.name), (set, list, dict))}
    return dataclasses.replace(record, **changes)
