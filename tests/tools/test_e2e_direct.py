"""A direct WebRTC (aiortc) caller and the worker's tools: the reference model with `--responder
openai` against a tool-calling chat endpoint (tests.support.chat_stub), the tools at the edge."""

from __future__ import annotations

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.speech import speak, transcribe, words
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.app.tools_setup import require_tool_calls
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.tools.loading import load_tool_module
from duplex_agent.agent.tools.toolbox import ToolBox
from duplex_agent.plugins.reference.plugin import ReferenceOptions, ReferencePlugin
from duplex_agent.webrtc.direct.host_address import interface_ipv4
from tests.integration.conftest import Microphone
from tests.support.chat_stub import start_server
from tests.support.heard import reply_heard
from tests.support.waits import until
from tests.tools import e2e_tools
from tests.tools.chat_model import announcing_hang_up
from tests.webrtc.client_peer import ClientPeer


@pytest.fixture
async def tool_worker():
    """The embedded worker with the reference model, its chat endpoint and the e2e tools:
    (http client, backend, ice address, the endpoint's requests)."""
    e2e_tools.HUNG_UP.clear()
    seen: list[dict] = []
    chat, base_url = await start_server(announcing_hang_up(seen))
    plugin = ReferencePlugin(as_float32_audio)
    plugin.configure(ReferenceOptions(responder="openai", openai_base_url=base_url, openai_model="stub"),
                     max_sessions=1)
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=1)
    tools = ToolBox(load_tool_module("tests.tools.e2e_tools"))
    require_tool_calls(tools, backend.capabilities)
    address = interface_ipv4()
    client = TestClient(TestServer(build_app(backend, Settings(ice_address=address), tools=tools), host="127.0.0.1"))
    await client.start_server()
    yield client, backend, address, seen
    await client.close()
    await backend.close()
    await chat.cleanup()


def transcripts(peer: ClientPeer) -> list[str]:
    return [m["transcript"] for m in peer.messages if m.get("type") == "response.output_audio_transcript.done"]


def outputs(peer: ClientPeer) -> list[str]:
    return [m["item"]["output"] for m in peer.messages
            if m.get("type") == "conversation.item.added" and m.get("item", {}).get("type") == "function_call_output"]


async def test_a_caller_asks_the_weather_and_hears_the_tools_answer(tool_worker):
    http, backend, address, seen = tool_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")
        since = len(peer.received)
        mic.say(speak("What's the weather in Paris?", 48000, before_ms=300, after_ms=1500))
        await until(lambda: any("sunny" in t.lower() for t in transcripts(peer)), 90, "the spoken answer")
        # The edge ran the tool: its output went into the conversation, then the answer said it.
        assert outputs(peer) == ["It is sunny and 21 degrees in Paris."]
        assert any(m.get("role") == "tool" for m in seen[-1]["messages"])
        answer_at = len(peer.received)
        await until(lambda: peer.loud_frames() > 0 and _quiet_for(peer, answer_at, 40), 60, "the answer to play out")
        # What the caller heard carries the tool's result (Whisper tiny.en hears "Paris" as
        # "pairs" and now and then "sunny" as "Sonny" in this voice; the transcript has them).
        heard = transcribe(np.concatenate(peer.received[since:]), 48000)
        answer = next(t for t in transcripts(peer) if "sunny" in t.lower())
        assert reply_heard(heard, answer) and "degrees" in words(heard), (heard, answer)
        assert any("sunny and 21 degrees in paris" in t.lower() for t in transcripts(peer)), transcripts(peer)
    finally:
        await peer.close()


async def test_an_after_heard_hang_up_talked_over_is_never_made(tool_worker):
    http, backend, address, _ = tool_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")
        mic.say(speak("Please hang up now.", 48000, before_ms=300, after_ms=1000))
        await until(lambda: "response.function_call_arguments.done" in peer.message_types(), 60, "the hang-up call")
        since = len(peer.received)
        await until(lambda: peer.loud_frames() > 0 and _loud_since(peer, since) > 30, 60, "the goodbye to be heard")
        mic.say(speak("Wait, no, do not hang up, I have another question.", 48000, after_ms=600))
        await until(lambda: outputs(peer), 30, "the hang-up's output")
        assert "caller_interrupted" in outputs(peer)[0]
        assert e2e_tools.HUNG_UP == []
        assert "session.closed" not in peer.message_types() and backend.active_sessions == 1
    finally:
        await peer.close()


async def test_an_after_heard_hang_up_is_made_once_its_goodbye_is_heard(tool_worker):
    http, backend, address, _ = tool_worker
    mic = Microphone()
    peer = ClientPeer(address, mic.next_frame)
    try:
        await peer.connect(http)
        await until(lambda: backend.active_sessions == 1, 10, "the session to open")
        await until(lambda: peer.received, 30, "the agent's track to flow")
        since = len(peer.received)
        mic.say(speak("Please hang up now.", 48000, before_ms=300, after_ms=500))
        await until(lambda: e2e_tools.HUNG_UP, 90, "the hang-up")
        assert _loud_since(peer, since) > 100  # the whole goodbye (seconds of it) went out first
        await until(lambda: {"type": "session.closed", "reason": "hung_up"} in
                    [{"type": m.get("type"), "reason": m.get("reason")} for m in peer.messages], 10, "the page told")
        await until(lambda: backend.active_sessions == 0, 10, "the call to end")
    finally:
        await peer.close()


def _loud_since(peer: ClientPeer, since: int, threshold: float = 0.02) -> int:
    return sum(float(np.sqrt(np.mean(f**2))) > threshold for f in peer.received[since:])


def _quiet_for(peer: ClientPeer, since: int, frames: int) -> bool:
    """``frames`` quiet frames at the end, after some sound since ``since``."""
    tail = peer.received[-frames:]
    return len(peer.received) - since > frames and _loud_since(peer, since) > 0 and \
        all(float(np.sqrt(np.mean(f**2))) < 0.005 for f in tail)
