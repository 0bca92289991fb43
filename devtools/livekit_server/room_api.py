"""LiveKit's RoomService and AgentDispatchService, the parts an agent and a dialing CLI use:
create and delete a room, list, get and remove its participants, dispatch an agent to it.
The grants are LiveKit's: ``room_create`` to create or delete a room, ``room_admin`` of that
room for the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from livekit import api
from livekit.protocol import agent_dispatch, models
from livekit.protocol import room as room_pb

from .twirp import TwirpError, TwirpRouter, require_room_admin, require_room_create

if TYPE_CHECKING:
    from .server import ServerCore

Claims = api.access_token.Claims


class RoomApi:
    def __init__(self, server: ServerCore) -> None:
        self._server = server

    def register(self, router: TwirpRouter) -> None:
        router.add("RoomService", "CreateRoom", room_pb.CreateRoomRequest, self.create_room)
        router.add("RoomService", "DeleteRoom", room_pb.DeleteRoomRequest, self.delete_room)
        router.add("RoomService", "ListParticipants", room_pb.ListParticipantsRequest, self.list_participants)
        router.add("RoomService", "GetParticipant", room_pb.RoomParticipantIdentity, self.get_participant)
        router.add("RoomService", "RemoveParticipant", room_pb.RoomParticipantIdentity, self.remove_participant)
        router.add("AgentDispatchService", "CreateDispatch", agent_dispatch.CreateAgentDispatchRequest,
                   self.create_dispatch)

    async def create_room(self, claims: Claims, request: room_pb.CreateRoomRequest) -> models.Room:
        require_room_create(claims)
        if not request.name:
            raise TwirpError("invalid_argument", "no room name")
        room, _ = self._server.get_or_create_room(request.name)
        if request.metadata:
            room.metadata = request.metadata
        for dispatch in request.agents:
            await self._server.create_dispatch(request.name, dispatch.agent_name, dispatch.metadata)
        return room.info()

    async def delete_room(self, claims: Claims, request: room_pb.DeleteRoomRequest) -> room_pb.DeleteRoomResponse:
        require_room_create(claims)
        if request.room not in self._server.rooms:
            raise TwirpError("not_found", "requested room does not exist")
        await self._server.close_room(request.room)
        return room_pb.DeleteRoomResponse()

    async def list_participants(self, claims: Claims,
                                request: room_pb.ListParticipantsRequest) -> room_pb.ListParticipantsResponse:
        require_room_admin(claims, request.room)
        room = self._server.rooms.get(request.room)
        if room is None:
            raise TwirpError("not_found", "requested room does not exist")
        return room_pb.ListParticipantsResponse(participants=[p.info for p in room.participants.values()])

    async def get_participant(self, claims: Claims, request: room_pb.RoomParticipantIdentity) -> models.ParticipantInfo:
        require_room_admin(claims, request.room)
        return self._participant(request).info

    async def remove_participant(self, claims: Claims,
                                 request: room_pb.RoomParticipantIdentity) -> room_pb.RemoveParticipantResponse:
        require_room_admin(claims, request.room)
        self._participant(request)
        await self._server.remove_participant(request.room, request.identity)
        return room_pb.RemoveParticipantResponse()

    async def create_dispatch(self, claims: Claims,
                              request: agent_dispatch.CreateAgentDispatchRequest) -> agent_dispatch.AgentDispatch:
        require_room_admin(claims, request.room)
        record = await self._server.create_dispatch(request.room, request.agent_name, request.metadata)
        return agent_dispatch.AgentDispatch(id=record.id, agent_name=record.agent_name, room=record.room,
                                            metadata=record.metadata)

    def _participant(self, request: room_pb.RoomParticipantIdentity):
        room = self._server.rooms.get(request.room)
        participant = room.participants.get(request.identity) if room is not None else None
        if participant is None:
            raise TwirpError("not_found", "participant does not exist")
        return participant
