"""Every client command shape vLLM-Omni 0.30.0's parser accepts (engine/duplex/realtime_commands.py),
sent to the real vLLM-Omni server and to ours; the answers must agree key by key.

A failure prints the difference: event names in order, keys with their JSON types, error codes.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from tests.omni_peer.wire_shapes import Case, Intended, diff, run_case, unexcused


def _pcm16(ms: int) -> str:
    t = np.arange(16 * ms) / 16000
    return base64.b64encode((0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()).decode()


APPEND = {"type": "input_audio_buffer.append", "audio": _pcm16(600), "format": "pcm16", "sample_rate_hz": 16000}
USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}

CASES = [
    Case("session.update", [{"type": "session.update", "session": {"instructions": "be brief"}}]),
    Case("session.update old playback_commit_policy",
         [{"type": "session.update", "session": {"playback_commit_policy": "ack"}}]),
    Case("session.update unsupported input format",
         [{"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}]),
    Case("input_audio_buffer.append", [APPEND]),
    Case("input_audio_buffer.append bad base64", [{**APPEND, "audio": "not base64!"}]),
    Case("input_audio_buffer.commit bare", [APPEND, {"type": "input_audio_buffer.commit"}]),
    Case("input_audio_buffer.commit response_create", [APPEND, {"type": "input_audio_buffer.commit",
                                                                "response_create": True}], until="response.done"),
    Case("input.commit", [APPEND, {"type": "input.commit"}], until="response.done"),
    Case("input_audio_buffer.commit empty", [{"type": "input_audio_buffer.commit"}]),
    Case("input_audio_buffer.clear", [APPEND, {"type": "input_audio_buffer.clear"}]),
    Case("output_audio_buffer.clear idle", [{"type": "output_audio_buffer.clear"}]),
    Case("response.create after commit", [APPEND, {"type": "input_audio_buffer.commit"},
                                          {"type": "response.create"}], until="response.done"),
    Case("response.cancel idle", [{"type": "response.cancel"}]),
    Case("response.cancel after the reply finished",
         [APPEND, {"type": "input_audio_buffer.commit", "response_create": True}], until="response.done",
         after=[{"type": "response.cancel"}]),
    Case("turn.signal response.cancel idle", [{"type": "turn.signal", "event": "response.cancel"}]),
    Case("turn.signal response.cancel after the reply finished",
         [APPEND, {"type": "input_audio_buffer.commit", "response_create": True}], until="response.done",
         after=[{"type": "turn.signal", "event": "response.cancel"}]),
    Case("playback.ack idle", [{"type": "playback.ack", "played_ms": 0}]),
    Case("audio.playback_ack idle", [{"type": "audio.playback_ack", "played_ms": 0}]),
    Case("playback.ack without played_ms", [{"type": "playback.ack"}]),
    Case("session.heartbeat", [{"type": "session.heartbeat"}]),
    Case("conversation.item.create text", [{"type": "conversation.item.create", "item": USER_TEXT}]),
    Case("conversation.item.create without item", [{"type": "conversation.item.create"}]),
    Case("conversation.item.retrieve unknown", [{"type": "conversation.item.retrieve", "item_id": "item_x"}]),
    Case("conversation.item.delete unknown", [{"type": "conversation.item.delete", "item_id": "item_x"}]),
    Case("conversation.item.delete without item_id", [{"type": "conversation.item.delete"}]),
    Case("conversation.item.truncate unknown",
         [{"type": "conversation.item.truncate", "item_id": "item_x", "audio_end_ms": 100}]),
    Case("input.text.append", [{"type": "input.text.append", "text": "hello"}]),
    Case("input.cancel", [{"type": "input.cancel"}]),
    Case("barge_in idle", [{"type": "barge_in"}]),
    Case("turn.signal unknown event", [{"type": "turn.signal", "event": "wave"}]),
    Case("turn.signal without event", [{"type": "turn.signal"}]),
    Case("unknown event type", [{"type": "no.such.event"}]),
    Case("malformed JSON", ["{not json"]),
    Case("session.close", [{"type": "session.close"}], until="session.closed"),
    # The parser's aliases and turn.signal's inner events.
    Case("close (alias)", [{"type": "close"}], until="session.closed"),
    Case("close_session (alias)", [{"type": "close_session"}], until="session.closed"),
    Case("input_text.append (alias)", [{"type": "input_text.append", "text": "hello"}]),
    Case("push_text (alias)", [{"type": "push_text", "text": "hello"}]),
    Case("signal_turn (alias) unknown event", [{"type": "signal_turn", "event": "wave"}]),
    Case("turn.signal session.update", [{"type": "turn.signal", "event": "session.update",
                                         "payload": {"instructions": "be brief"}}]),
    Case("turn.signal conversation.item.create", [{"type": "turn.signal", "event": "conversation.item.create",
                                                   "payload": {"item": USER_TEXT}}]),
    Case("turn.signal conversation.item.delete unknown", [{"type": "turn.signal", "event": "conversation.item.delete",
                                                           "payload": {"item_id": "item_x"}}]),
    Case("turn.signal input.cancel", [{"type": "turn.signal", "event": "input.cancel"}]),
    Case("turn.signal barge_in", [{"type": "turn.signal", "event": "barge_in"}]),
    Case("input_audio_buffer.commit final false", [APPEND, {"type": "input_audio_buffer.commit", "final": False}]),
    Case("response.create text only", [APPEND, {"type": "input_audio_buffer.commit"},
                                       {"type": "response.create", "response": {"modalities": ["text"]}}],
         until="response.done"),
    Case("output_audio_buffer.clear with response_id", [{"type": "output_audio_buffer.clear",
                                                         "response_id": "resp_x"}]),
    Case("session.event_ack", [{"type": "session.event_ack", "server_event_seq": 1}]),
    # Answered in command order: after the answer to the command before.
    Case("input_audio_buffer.clear then turn.signal", [APPEND, {"type": "input_audio_buffer.clear"},
                                                       {"type": "turn.signal", "event": "wave"}]),
    Case("input_audio_buffer.clear then input.text.append", [APPEND, {"type": "input_audio_buffer.clear"},
                                                             {"type": "input.text.append", "text": "hello"}]),
    Case("input_audio_buffer.clear then session.heartbeat", [APPEND, {"type": "input_audio_buffer.clear"},
                                                             {"type": "session.heartbeat"}]),
]


#: Differences we keep on purpose, each in docs/protocol.md ("Where we differ from vLLM-Omni 0.30.0, on
#: purpose"); only these exact lines are excused, in their case only, so any new difference still fails.
_EVENT_ORDER = ("events: vLLM-Omni [*", "        ours      [*")
_REPLY_SEQUENCE = ("our reply's event sequence: no response.output_item.added/done, response.content_part.added/done "
                   "or rate_limits.updated; transcript deltas follow their audio; the caller's words come as "
                   "conversation.item.input_audio_transcription.completed")
_BARE_COMMIT = "a bare commit answers on our turn-based endpoint (vLLM-Omni: response_create defaults to false)"
_FULL_AUDIO = "response.done does not repeat the whole reply's audio (it went out as deltas)"
INTENDED = [
    Intended("session.update unsupported input format",
             ("events: vLLM-Omni ['session.updated']", "        ours      ['error']",
              "error codes: vLLM-Omni [], ours ['session_field_immutable']"),
             "the input stream's format is fixed once the session started: a change is refused, not applied "
             "to audio already streaming"),
    # The reply's assistant item follows the user's, so its item events name a previous item.
    *(Intended(case, (*_EVENT_ORDER, *(f"conversation.item.{kind}: previous_item_id is null in vLLM-Omni, string in ours"
                                       for kind in ("added", "created", "done"))), _BARE_COMMIT)
      for case in ("input_audio_buffer.commit bare", "input_audio_buffer.commit final false")),
    Intended("response.create after commit",
             (*_EVENT_ORDER, "error codes: vLLM-Omni [], ours ['response_create_without_input']"),
             _BARE_COMMIT + ", so the response.create after it finds no input left"),
    Intended("response.create text only",
             (*_EVENT_ORDER, "error codes: vLLM-Omni [], ours ['response_create_without_input']"),
             _BARE_COMMIT + ", so the response.create after it finds no input left"),
    *(Intended(case, _EVENT_ORDER, _REPLY_SEQUENCE)
      for case in ("input_audio_buffer.commit response_create", "input.commit",
                   "response.cancel after the reply finished", "turn.signal response.cancel after the reply finished")),
    *(Intended(case, ("response.done: response.metadata lacks audio (string)",), _FULL_AUDIO)
      for case in ("input_audio_buffer.commit response_create", "input.commit", "response.create after commit",
                   "response.cancel after the reply finished", "turn.signal response.cancel after the reply finished",
                   "response.create text only")),
    Intended("output_audio_buffer.clear with response_id",
             ("events: vLLM-Omni ['output_audio_buffer.cleared', 'response.output_item.done', "
              "'conversation.item.done', 'response.done', 'rate_limits.updated']",
              "        ours      ['output_audio_buffer.cleared']"),
             "clearing a response that does not exist announces no done events for it"),
]


@pytest.fixture(scope="module")
def servers(started, omni_peers):
    # Every case opens a session on each; closed ones free their slot at once, but leave room.
    return omni_peers(), started.serve(plugin="scripted", extra=["--max-sessions", "16"])


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_command_answer_matches_vllm_omni(servers, case):
    peer, ours = servers
    # Two servers, a fresh session on each: the runs are independent, so they go side by side.
    real, mine = await asyncio.gather(run_case(peer.realtime_url, case), run_case(ours.realtime_url, case))
    assert not real.note, f"the real vLLM-Omni server did not answer {case.name}: {real.note} {real.names}"
    differences, extras = diff(real, mine)
    if extras:
        print(f"{case.name}: our extras (a vLLM-Omni client ignores them):\n" + "\n".join(extras))
    remaining, stale = unexcused(case.name, differences, INTENDED)
    for entry in stale:
        print(f"{case.name}: the intended difference ({entry.reason}) did not occur this run")
    assert not remaining, f"{case.name}: ours differs from vLLM-Omni 0.30.0\n" + "\n".join(remaining)


async def test_connecting_with_a_model_opens_the_session_unasked(servers):
    """vLLM-Omni autostarts a session when the URL names a model and does not say autostart=0."""
    import aiohttp

    for server, name in zip(servers, ("vLLM-Omni", "ours")):
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(server.realtime_url + "&model=duplex", max_msg_size=64 << 20) as ws:
            first = await ws.receive(timeout=30)
            assert first.type == aiohttp.WSMsgType.TEXT, f"{name}: {first.type.name}"
            assert '"session.created"' in first.data, f"{name}: {first.data[:300]}"
            await ws.send_str('{"type": "session.close"}')
