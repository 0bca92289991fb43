"""Client events as a remote server's messages (agent/remote/client_events.py): no socket, no loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.remote import client_events
from duplex_agent.agent.remote.session import parse_session_created

from .fake_server import OMNI_CAPS, session_created

OURS_CAPS = {"plugin_id": "reference", "input_sample_rate": 16000, "unit_samples": 1600, "output_sample_rate": 22050,
             "max_sessions": 4, "input_mode": "turn", "supports_barge_in": True, "supports_playback_ack": True,
             "supports_truncation": True, "supports_resume": False}
OMNI = parse_session_created(session_created(caps={**OMNI_CAPS, "supports_audio_truncate": True}), model="",
                             max_sessions=1)
OURS = parse_session_created({"session": {"id": "s", "capabilities": OURS_CAPS}}, model="", max_sessions=1)


def test_appends_name_their_format_and_rate_and_carry_their_audio_ms():
    assert client_events.appends([("AAA=", 100.0), ("BBB=", 40.0)], audio_format="pcm16", sample_rate_hz=16000) == [
        ({"type": "input_audio_buffer.append", "audio": "AAA=", "format": "pcm16", "sample_rate_hz": 16000}, 100.0),
        ({"type": "input_audio_buffer.append", "audio": "BBB=", "format": "pcm16", "sample_rate_hz": 16000}, 40.0)]


def test_a_commit_asks_vllm_omni_for_a_reply_unless_the_transport_said_otherwise():
    assert client_events.commit(p.InputAudioBufferCommit(), OMNI) == {
        "type": "input_audio_buffer.commit", "response_create": True}
    assert client_events.commit(p.InputAudioBufferCommit(response_create=False), OMNI) == {
        "type": "input_audio_buffer.commit", "response_create": False}
    assert client_events.commit(p.InputAudioBufferCommit(), OURS) == {"type": "input_audio_buffer.commit"}


def test_the_input_audio_of_a_session_update_is_checked_and_fixed_once_started():
    update = p.SessionUpdate({"input_audio_format": "pcm_f32le", "input_sample_rate": 48000}, event_id="u1")
    assert client_events.input_audio(update, current=("pcm16", 16000), started=False) == ("pcm_f32le", 48000)
    # an update that leaves them out keeps the current ones, started or not
    assert client_events.input_audio(p.SessionUpdate({"instructions": "hi"}), current=("pcm16", 24000),
                                     started=True) == ("pcm16", 24000)
    with pytest.raises(p.ProtocolError) as refused:
        client_events.input_audio(update, current=("pcm16", 16000), started=True)
    assert (refused.value.code, refused.value.event_id) == ("session_field_immutable", "u1")
    with pytest.raises(p.ProtocolError, match="input_sample_rate"):
        client_events.input_audio(p.SessionUpdate({"input_sample_rate": 12345}), current=("pcm16", 16000),
                                  started=False)
    with pytest.raises(p.ProtocolError, match="input_audio_format"):
        client_events.input_audio(p.SessionUpdate({"input_audio_format": "opus"}), current=("pcm16", 16000),
                                  started=False)


def test_a_session_update_keeps_the_transports_audio_fields_and_its_event_id():
    update = p.SessionUpdate({"input_sample_rate": 48000, "instructions": "be brief"}, event_id="u1")
    assert client_events.session_update(update, OURS) == {
        "type": "session.update", "session": {"instructions": "be brief"}, "event_id": "u1"}
    assert "event_id" not in client_events.session_update(p.SessionUpdate({}), OURS)


def test_dtmf_digits_are_checked_and_never_sent():
    assert client_events.dtmf_digit(p.InputDtmf(digit="#")) == "#"
    with pytest.raises(p.ProtocolError) as refused:
        client_events.dtmf_digit(p.InputDtmf(digit="x", event_id="d1"))
    assert (refused.value.code, refused.value.event_id) == ("invalid_field", "d1")


def test_cancels_in_each_servers_words():
    barge_in = p.ResponseCancel(reason="barge_in")
    assert client_events.cancel(barge_in, "r1", OMNI) == [{"type": "barge_in"}]
    assert client_events.cancel(barge_in, "r1", OURS) == [
        {"type": "response.cancel", "response_id": "r1", "reason": "barge_in"}]
    assert client_events.cancel(p.ResponseCancel(), "r1", OMNI) == [{"type": "response.cancel", "response_id": "r1"}]
    assert client_events.cancel(p.ResponseCancel(), None, OMNI) == [{"type": "response.cancel"}]


def test_a_barge_in_on_a_model_that_cannot_be_interrupted_ends_here_and_sends_nothing():
    stubborn = replace(OMNI, capabilities=replace(OMNI.capabilities, supports_barge_in=False))
    barge_in = p.ResponseCancel(reason="barge_in")
    assert client_events.barge_in_ends_here(barge_in, stubborn.capabilities)
    assert client_events.cancel(barge_in, "r1", stubborn) == []
    # a plain cancel still goes to the server
    assert not client_events.barge_in_ends_here(p.ResponseCancel(), stubborn.capabilities)
    assert client_events.cancel(p.ResponseCancel(), "r1", stubborn) == [{"type": "response.cancel", "response_id": "r1"}]


def test_a_transports_playback_ack_is_passed_on_and_truncates_a_cut_reply():
    caps = OMNI.capabilities
    ack = p.PlaybackAck(played_ms=900.0)
    assert client_events.playback_ack(ack, response_id="r1", item_id="item_r1", cut=False, caps=caps) == [
        {"type": "playback.ack", "response_id": "r1", "played_ms": 900.0, "committed_ms": 900.0, "item_id": "item_r1"}]
    assert client_events.playback_ack(ack, response_id="r1", item_id=None, cut=True, caps=caps) == [
        {"type": "playback.ack", "response_id": "r1", "played_ms": 900.0, "committed_ms": 900.0, "truncate": True}]
    partial = p.PlaybackAck(played_ms=900.0, committed_ms=400.0, truncate=True)
    [message] = client_events.playback_ack(partial, response_id="r1", item_id=None, cut=False, caps=caps)
    assert (message["committed_ms"], message["truncate"]) == (400.0, True)


def test_a_server_without_playback_acks_gets_a_truncate_or_nothing():
    truncating = replace(OURS.capabilities, supports_playback_ack=False)
    ack = p.PlaybackAck(played_ms=300.0)
    assert client_events.playback_ack(ack, response_id="r1", item_id="item_r1", cut=False, caps=truncating) == [
        {"type": "conversation.item.truncate", "item_id": "item_r1", "content_index": 0, "audio_end_ms": 300.0}]
    assert client_events.playback_ack(ack, response_id="r1", item_id=None, cut=False, caps=truncating) == []
    neither = replace(truncating, supports_truncation=False)
    assert client_events.playback_ack(ack, response_id="r1", item_id="item_r1", cut=False, caps=neither) == []


def test_an_ack_asks_to_truncate_only_where_the_server_can():
    no_truncation = replace(OMNI.capabilities, supports_truncation=False)
    assert client_events.ack("r1", "item_r1", 100, 100, truncate=True, caps=no_truncation, event_id="e1") == {
        "type": "playback.ack", "response_id": "r1", "played_ms": 100, "committed_ms": 100, "event_id": "e1",
        "item_id": "item_r1"}


def test_other_events_go_as_they_are_and_a_truncate_only_where_the_server_can():
    truncate = p.ConversationItemTruncate(item_id="item_r1", audio_end_ms=250.0)
    assert client_events.forwarded(truncate, OURS.capabilities) == [
        {"type": "conversation.item.truncate", "item_id": "item_r1", "audio_end_ms": 250.0, "content_index": 0}]
    assert client_events.forwarded(truncate, replace(OURS.capabilities, supports_truncation=False)) == []
    assert client_events.forwarded(p.InputAudioBufferClear(event_id="c1"), OMNI.capabilities) == [
        {"type": "input_audio_buffer.clear", "event_id": "c1"}]
    assert client_events.forwarded(p.ResponseCreate(), OMNI.capabilities) == [{"type": "response.create"}]
