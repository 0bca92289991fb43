"""What a tool's call control does on each transport: a direct peer hangs up by closing (and is
not kept for a resume); a LiveKit caller is removed through the room's API; transfer and DTMF
need a phone line, and say so in a sentence the model can repeat."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
from aiortc import RTCPeerConnection
from livekit import rtc

from duplex_agent.agent.protocol.events import ConversationItemCreate, SpeechStopped
from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.toolbox import EdgeToolOptions, ToolBox
from duplex_agent.webrtc.direct.call_control import DirectCallControl
from duplex_agent.webrtc.direct.peer_session import HUNG_UP, PeerSession
from duplex_agent.webrtc.livekit.call_control import LiveKitCallControl
from tests.support.waits import until
from tests.tools import toolkit
from tests.tools.harness import call_events
from tests.webrtc.fakes import CAPS, EnergyVadModel, FakeConversation


async def test_a_direct_call_hangs_up_and_has_no_phone_line():
    ended: list[str] = []
    control = DirectCallControl(ended.append)
    await control.hang_up("goodbye")
    assert ended == ["goodbye"] and control.kind == "direct"
    for action in (control.transfer("tel:+15550100"), control.send_dtmf("12")):
        with pytest.raises(CallControlError) as caught:
            await action
        assert caught.value.code == "needs_phone_call" and "phone call" in str(caught.value)


async def test_a_hang_up_tool_on_a_direct_peer_tells_the_page_and_closes_it():
    runs = toolkit.reset()
    box = ToolBox(load_tool_module("tests.tools.toolkit"), EdgeToolOptions())
    conversation = FakeConversation(replace(CAPS, supports_tools=True))
    finished: list[str] = []
    session = PeerSession("pc-1", RTCPeerConnection(), conversation, on_finished=lambda s, reason: finished.append(reason),
                          tools=box, vad_model=EnergyVadModel())
    await session.start()
    try:
        conversation.emit(SpeechStopped(1000.0))  # "bye!": the model calls hang_up with no words before it
        for event in call_events("r1", "c1", "hang_up", "{}"):
            conversation.emit(event)
        await until(lambda: finished, 5, "the peer to be finished")
        assert finished == [HUNG_UP] and runs.names() == ["hang_up"]
        assert runs.contexts[0].call is session and runs.contexts[0].caller_identity == "pc-1"
        page = [json.loads(message) for message in session._early]
        assert {"type": "session.closed", "reason": HUNG_UP} in [
            {k: m.get(k) for k in ("type", "reason")} for m in page]
        await until(lambda: conversation.sent_of(ConversationItemCreate), 5, "the tool's output")
    finally:
        await session.close(HUNG_UP)


@dataclass
class Participant:
    identity: str
    kind: int


@dataclass
class Room:
    name: str = "call-1"


class RoomService:
    def __init__(self, fail: bool = False) -> None:
        self.removed: list[tuple[str, str]] = []
        self.fail = fail

    async def remove_participant(self, remove) -> None:
        if self.fail:
            raise ConnectionError("the server is gone")
        self.removed.append((remove.room, remove.identity))


class RoomApi:
    def __init__(self, fail: bool = False) -> None:
        self.room = RoomService(fail)


STANDARD = rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD
SIP = rtc.ParticipantKind.PARTICIPANT_KIND_SIP


def livekit_control(kind: int = STANDARD, room_api: RoomApi | None = None) -> tuple[LiveKitCallControl, list[str]]:
    ended: list[str] = []
    control = LiveKitCallControl(Room(), Participant("alice", kind), end_call=ended.append,  # type: ignore[arg-type]
                                 room_api=room_api)  # type: ignore[arg-type]
    return control, ended


async def test_a_livekit_hang_up_removes_the_caller_through_the_room_api():
    api = RoomApi()
    control, ended = livekit_control(room_api=api)
    await control.hang_up("goodbye")
    assert api.room.removed == [("call-1", "alice")] and ended == []


async def test_without_the_room_api_or_when_it_fails_the_agent_ends_its_side():
    control, ended = livekit_control()
    await control.hang_up("goodbye")
    assert ended == ["goodbye"]
    control, ended = livekit_control(room_api=RoomApi(fail=True))
    with pytest.raises(CallControlError) as caught:
        await control.hang_up("goodbye")
    assert caught.value.code == "hang_up_failed" and ended == ["goodbye"]


async def test_livekit_transfer_and_dtmf_need_a_phone_line_which_a_telephony_setup_provides():
    control, _ = livekit_control(STANDARD)
    assert control.kind == "livekit"
    with pytest.raises(CallControlError, match="phone call"):
        await control.transfer("tel:+15550100")
    with pytest.raises(CallControlError) as caught:
        await control.send_dtmf("12x")
    assert caught.value.code == "invalid_digits"
    phone, _ = livekit_control(SIP)
    assert phone.kind == "sip"
    for action in (phone.transfer("tel:+15550100"), phone.send_dtmf("12#")):
        with pytest.raises(CallControlError) as caught:
            await action
        assert caught.value.code == "not_set_up"

    class Telephony(LiveKitCallControl):
        async def transfer_sip(self, to: str) -> None:
            self.transferred = to

    extended = Telephony(Room(), Participant("bob", SIP), end_call=lambda reason: None)  # type: ignore[arg-type]
    await extended.transfer("tel:+15550100")
    assert extended.transferred == "tel:+15550100"
