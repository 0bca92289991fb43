"""Our endpoint where vLLM-Omni 0.30.0's real server was seen to answer differently (issue 21).

Each expectation is what 0.30.0's own code sends: ``protocol.duplex.events`` (the wire
rendering), ``engine.duplex.realtime_events`` (the projection), ``entrypoints.duplex``
(the handshake and disconnect).
"""

from __future__ import annotations

import pytest

from duplex_agent.plugins.scripted import Script
from tests.support.audio import tone

MANUAL = {"turn_detection": None}


async def ask(omni) -> None:
    await omni.append(tone(200))
    await omni.send({"type": "input_audio_buffer.commit"})


@pytest.mark.parametrize("cancel", [
    {"type": "response.cancel", "event_id": "evt_late"},
    {"type": "turn.signal", "event": "response.cancel", "event_id": "evt_late"},
])
async def test_a_cancel_after_the_latest_reply_finished_is_response_not_active(our_server, cancel):
    _, client, _, _ = await our_server(Script(reply="done already"))
    omni = client()
    await omni.open(MANUAL)
    await ask(omni)
    done, _ = await omni.until("response.done")
    await omni.append(tone(3000))  # 150 appends keep the session's mailbox busy when the cancel arrives
    await omni.send({"type": "input_audio_buffer.clear"})
    await omni.send(cancel)
    error, seen = await omni.until("error")
    assert error["error"]["code"] == "response_not_active" and error["error"]["event_id"] == "evt_late"
    assert done["response_id"] in error["error"]["message"]
    kinds = [e["type"] for e in seen]
    assert "output_audio_buffer.cleared" not in kinds
    assert "input_audio_buffer.cleared" in kinds, f"answered ahead of the clear sent before it: {kinds}"
    # A cancel while a reply runs still cancels it.
    await ask(omni)
    await omni.until("response.created")
    await omni.send({"type": "response.cancel"})
    cancelled, _ = await omni.until("response.done")
    assert cancelled["response"]["status"] in ("cancelled", "completed")


async def test_a_model_in_the_query_opens_the_session_before_any_client_message(our_server):
    url, client, _, _ = await our_server()
    omni = client()
    await omni.connect("&model=scripted")
    created = await omni.recv()
    assert created["type"] == "session.created" and created["resume_token"]
    echo = await omni.recv()
    assert echo["type"] == "session.updated"
    # A session.update then updates that session; it opens no other.
    await omni.send({"type": "session.update", "session": {"instructions": "later", **MANUAL}})
    updated, _ = await omni.until("session.updated")
    assert updated["session"]["id"] == created["session"]["id"] and updated["session"]["instructions"] == "later"


async def test_autostart_0_waits_for_the_first_message(our_server):
    _, client, _, _ = await our_server()
    omni = client()
    await omni.connect("&model=scripted&autostart=0")
    await omni.send({"type": "session.update", "session": {"instructions": "mine", **MANUAL}})
    created = await omni.recv()
    assert created["type"] == "session.created" and created["session"]["instructions"] == "mine"


async def test_turn_events_carry_vllm_omnis_fields(our_server):
    _, client, _, _ = await our_server(Script(reply="one two three four five six", word_delay_s=0.05))
    omni = client()
    created = await omni.open(MANUAL)
    session = created["session"]
    assert session["state"] == "open" and session["turn_state"] == "idle"
    assert isinstance(session["epoch"], int) and isinstance(session["turn_id"], int)
    await ask(omni)
    done, seen = await omni.until("response.done")
    by_type = {e["type"]: e for e in seen}
    committed = by_type["input_audio_buffer.committed"]
    assert committed["event"]["type"] == "input.committed"
    assert committed["event"]["realtime_item_id"] == committed["item_id"]
    assert committed["event"]["session_id"] == session["id"]
    transcribed = by_type["conversation.item.input_audio_transcription.completed"]
    assert transcribed["content_index"] == 0 and transcribed["item_id"] == committed["item_id"]
    speak = by_type["response.speak"]
    assert speak["item_id"] == by_type["response.created"]["item_id"]
    assert speak["metadata"]["session_id"] == session["id"] and speak["metadata"]["model_speak"] is True
    assert done["response"]["status_details"] == {"type": "completed", "reason": "stop"}
    # A cancelled reply says why.
    await ask(omni)
    await omni.until("response.output_audio.delta")
    await omni.send({"type": "response.cancel"})
    cancelled, _ = await omni.until("response.done")
    assert cancelled["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    # The session object follows the turn and the fence.
    await omni.send({"type": "session.update", "session": {"instructions": "again"}})
    updated, _ = await omni.until("session.updated")
    assert updated["session"]["turn_state"] == "idle" and updated["session"]["epoch"] > session["epoch"]


async def test_an_unknown_playback_commit_policy_is_taken_as_the_default(our_server):
    _, client, _, _ = await our_server()
    omni = await client().connect()
    await omni.send({"type": "session.update", "session": {"playback_commit_policy": "ack", **MANUAL}})
    created, seen = await omni.until("session.created")
    assert not [e for e in seen if e["type"] == "error"] and created["session"]["state"] == "open"
