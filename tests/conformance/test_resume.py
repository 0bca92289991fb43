"""Resumable sessions on our endpoint, as vLLM-Omni's clients use them."""

from __future__ import annotations

import asyncio

import pytest

from duplex_agent.plugins.scripted import Script
from tests.conformance.omni_client import OmniClient
from tests.support.audio import tone

MANUAL = {"turn_detection": None}
REPLY = " ".join(f"w{i}" for i in range(12))


async def resume(client: OmniClient, *, session_id: str, token: str, last_seq: int) -> dict:
    await client.connect("&autostart=0")
    await client.send({"type": "session.resume", "session_id": session_id, "resume_token": token,
                       "last_received_server_event_seq": last_seq})
    return await client.recv()


async def ask(client: OmniClient) -> None:
    await client.append(tone(200))
    await client.send({"type": "input_audio_buffer.commit"})


async def test_a_socket_dropped_mid_reply_resumes_with_nothing_lost_or_duplicated(our_server):
    _, new_client, _, _ = await our_server(Script(reply=REPLY, word_delay_s=0.05))
    first = new_client()
    await first.open(MANUAL)
    await ask(first)
    for _ in range(3):
        await first.until("response.output_audio.delta")
    first.drop()
    session_id, token, last_seq = first.session_id, first.resume_token, first.last_seq

    second = new_client()
    second.last_seq = last_seq
    resumed = await resume(second, session_id=session_id, token=token, last_seq=last_seq)
    assert resumed["type"] == "session.resumed" and resumed["session_id"] == session_id
    assert resumed["attachment_generation"] == 2 and resumed["resume_token"] != token
    done, replayed = await second.until("response.done")
    assert done["response"]["status"] == "completed"
    seqs = [e["server_event_seq"] for e in first.seen + replayed if "server_event_seq" in e]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every event once, in order, across both sockets
    deltas = [e for e in first.seen + replayed if e["type"] == "response.output_audio.delta"]
    assert [d["metadata"]["audio_duration_ms"] for d in deltas] == [100 * (n + 1) for n in range(len(deltas))]
    spoken = "".join(e["delta"] + " " for e in first.seen + replayed
                     if e["type"] == "response.output_audio_transcript.delta").split()
    assert spoken == REPLY.split()

    # The conversation goes on, on the new socket.
    await ask(second)
    again, _ = await second.until("response.done")
    assert again["response"]["status"] == "completed"
    # The token was single-use: the old one is refused, the rotated one works.
    third = new_client()
    refused = await resume(third, session_id=session_id, token=token, last_seq=second.last_seq)
    assert refused["type"] == "error" and refused["error"]["code"] == "invalid_resume_token"


async def test_resume_takes_over_a_live_socket_which_is_told_replaced(our_server):
    _, new_client, _, _ = await our_server()
    first = new_client()
    await first.open(MANUAL)
    await first.until("session.updated")
    second = new_client()
    resumed = await resume(second, session_id=first.session_id, token=first.resume_token, last_seq=first.last_seq)
    assert resumed["type"] == "session.resumed"
    replaced = await first.recv()
    assert replaced["type"] == "session.replaced" and replaced["attachment_generation"] == 1
    with pytest.raises(ConnectionError):
        await first.recv()
    await second.send({"type": "session.heartbeat"})
    await second.until("session.heartbeat_ack")


async def test_refused_resumes_get_vllm_omnis_codes(our_server):
    _, new_client, _, backend = await our_server(resume_grace_s=0.5)
    bad = await resume(new_client(), session_id="", token="t", last_seq=0)
    assert bad["error"]["code"] == "invalid_session_resume"
    unknown = await resume(new_client(), session_id="sess_nobody", token="t", last_seq=0)
    assert unknown["error"]["code"] == "session_resume_expired"

    first = new_client()
    await first.open(MANUAL)
    await first.until("session.updated")
    ahead = await resume(new_client(), session_id=first.session_id, token=first.resume_token,
                         last_seq=first.last_seq + 50)
    assert ahead["error"]["code"] == "session_resume_conflict"
    first.drop()
    for _ in range(1000):  # the grace period runs out: the session is gone
        if backend.active_sessions == 0:
            break
        await asyncio.sleep(0.01)
    assert backend.active_sessions == 0
    expired = await resume(new_client(), session_id=first.session_id, token=first.resume_token,
                           last_seq=first.last_seq)
    assert expired["error"]["code"] == "session_resume_expired"


async def test_acknowledged_events_are_forgotten_and_an_older_resume_must_resync(our_server):
    _, new_client, _, _ = await our_server(Script(reply="one two three"))
    first = new_client()
    await first.open(MANUAL)
    await ask(first)
    await first.until("response.done")
    await first.send({"type": "session.event_ack", "server_event_seq": first.last_seq})
    await first.send({"type": "session.heartbeat"})
    await first.until("session.heartbeat_ack")
    first.drop()
    gap = await resume(new_client(), session_id=first.session_id, token=first.resume_token,
                       last_seq=first.last_seq - 5)
    assert gap["type"] == "session.resync_required" and gap["reason"] == "journal_gap"


async def test_a_journal_overflow_is_told_once_and_the_live_session_goes_on(our_server):
    _, new_client, _, _ = await our_server(Script(reply=REPLY), journal_bytes=4000)
    client = new_client()
    await client.open(MANUAL)
    await ask(client)
    done, seen = await client.until("response.done")
    assert done["response"]["status"] == "completed"
    notices = [e for e in seen if e["type"] == "session.resync_required"]
    assert [n["reason"] for n in notices] == ["journal_overflow"]
    await ask(client)
    await client.until("response.done")
    assert sum(e["type"] == "session.resync_required" for e in client.seen) == 1
    client.drop()
    gap = await resume(new_client(), session_id=client.session_id, token=client.resume_token,
                       last_seq=client.last_seq)
    assert gap["type"] == "session.resync_required" and gap["reason"] == "journal_gap"


@pytest.mark.parametrize("code", [1000, 1001])
async def test_a_socket_the_client_closes_itself_keeps_the_session_for_a_resume(our_server, code):
    """vLLM-Omni 0.30.0: any disconnect detaches (a browser reload closes with 1001, then resumes)."""
    _, new_client, _, backend = await our_server()
    client = new_client()
    await client.open(MANUAL)
    await client.until("session.updated")
    assert client.ws is not None
    await client.ws.close(code=code)
    second = new_client()
    second.last_seq = client.last_seq
    resumed = await resume(second, session_id=client.session_id, token=client.resume_token,
                           last_seq=client.last_seq)
    assert resumed["type"] == "session.resumed" and backend.active_sessions == 1
    await ask(second)
    done, _ = await second.until("response.done")
    assert done["response"]["status"] == "completed"
    # Only session.close ends a session at once.
    await second.send({"type": "session.close"})
    await second.until("session.closed")
    for _ in range(1000):
        if backend.active_sessions == 0:
            break
        await asyncio.sleep(0.01)
    assert backend.active_sessions == 0
    gone = await resume(new_client(), session_id=client.session_id, token=second.resume_token,
                        last_seq=second.last_seq)
    assert gone["error"]["code"] == "session_resume_expired"
