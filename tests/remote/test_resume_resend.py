"""Client events written into a socket that died reach our own server after the resume, once each, in order.

Our remote backend against ``duplex-agent``'s realtime endpoint, through a loopback relay that
first swallows what the client writes and then cuts the link: those messages were written and
are certainly lost. The same run against the real vLLM-Omni is
``tests/omni_peer/test_remote_backend.py::test_dropped_backend_socket_resumes_with_nothing_lost``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin
from tests.support.waits import until
from tests.tcp_relay import TcpRelay


@pytest.fixture
async def relayed():
    plugin = ReferencePlugin(as_float32_audio)
    local = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    relay = await TcpRelay(server.port).start()
    remote = RemoteBackend(f"ws://127.0.0.1:{relay.port}/v1/realtime?duplex=1",
                           options=RemoteOptions(resume_backoff_s=0.05))
    await remote.start()
    yield remote, relay
    await remote.close()
    await relay.stop()
    await server.close()
    await local.close()


async def _not_found_answers(conversation, item_ids: list[str], timeout: float = 10.0) -> list[str]:
    """The items named by ``item_not_found`` errors, in arrival order, until every one in ``item_ids`` came."""
    answers: list[str] = []
    events = conversation.events()
    while not set(item_ids) <= set(answers):
        event = await asyncio.wait_for(anext(events), timeout)
        if isinstance(event, p.ErrorEvent) and event.code == "item_not_found":
            answers.append(str(event.error.get("event_id")))
    return answers


async def test_events_written_into_a_dead_socket_reach_our_server_once_in_order_after_the_resume(relayed):
    remote, relay = relayed
    conversation = await remote.open()
    assert conversation.capabilities.supports_resume
    conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id="before"))
    assert await _not_found_answers(conversation, ["before"]) == ["before"]

    relay.swallow_upstream()
    audio = (0.2 * np.sin(np.arange(1600) / 4)).astype(np.float32)
    lost = ["lost-1", "lost-2", "lost-3"]
    conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id=lost[0]))
    for _ in range(5):
        conversation.send(p.InputAudioBufferAppend(audio))
    conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id=lost[1]))
    conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id=lost[2]))
    # At least the five appends (each over 4 kB on the wire) went into the link before it is cut.
    await until(lambda: relay.swallowed > 5 * 4000, 10.0, "the appends to be written")
    assert relay.cut() >= 1

    assert await _not_found_answers(conversation, lost) == lost  # each once, in order
    assert conversation.resumes == 1
    assert conversation.resent_after_resume >= 6  # the first retrieve and the appends at least
    assert conversation.resume_dropped_input_ms == 0.0  # all of it is known lost: sent again, none dropped
    conversation.send(p.ConversationItemRetrieve(item_id="nope", event_id="after"))
    assert await _not_found_answers(conversation, ["after"]) == ["after"]
    await conversation.close()
