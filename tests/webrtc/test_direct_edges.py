"""The direct path's edges: the playout track's own Opus encode, the caller's channel pick,
and the data channel's coalesced traffic (transcript deltas, metrics), over a real aiortc peer."""

import asyncio
import fractions

import av
import numpy as np
import pytest
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from duplex_agent.agent.protocol.events import ResponseTranscriptDelta, ResponseTranscriptDone
from duplex_agent.webrtc.direct import peer_session
from duplex_agent.webrtc.direct.signaling import WEBRTC_PEERS
from duplex_agent.webrtc.direct.tracks import (
    OPUS_EXPECTED_LOSS_PERCENT,
    OpusVoiceEncoder,
    PlayoutTrack,
    frame_to_mono_f32,
)
from tests.support.audio import tone
from tests.support.waits import until

from .client_peer import ClientPeer, frames_of
from .fakes import EchoBackend
from .test_peer import serve


def test_the_voice_encoder_starts_with_fec_and_follows_the_expected_loss():
    encoder = OpusVoiceEncoder(24000)
    assert (encoder.fec, encoder.expected_loss_percent) == (True, OPUS_EXPECTED_LOSS_PERCENT)
    encoder.set_expected_loss(0)
    assert not encoder.fec
    encoder.set_expected_loss(7)
    assert (encoder.fec, encoder.expected_loss_percent) == (True, 7)


async def _packets(track: PlayoutTrack, n: int) -> list[av.Packet]:
    return [await track.recv() for _ in range(n)]


@pytest.mark.asyncio
async def test_the_playout_track_sends_mono_opus_that_decodes_to_its_frames():
    sound = tone(1000, hz=440.0, level=0.3, rate=48000)
    low, high = PlayoutTrack(frames_of(sound), bitrate=16000), PlayoutTrack(frames_of(sound), bitrate=64000)
    packets = await _packets(low, 50)
    loud = await _packets(high, 50)
    assert [p.pts for p in packets] == [960 * n for n in range(50)]
    assert packets[0].time_base == fractions.Fraction(1, 48000)
    assert sum(p.size for p in packets) < 0.5 * sum(p.size for p in loud)  # the bitrate setting holds

    decoder = OpusDecoder()  # what an aiortc peer (and a browser) does with them
    decoded = np.concatenate([
        frame_to_mono_f32(frame) for p in loud for frame in decoder.decode(JitterFrame(bytes(p), p.pts))
    ])
    assert decoded.size == 50 * 960
    spectrum = np.abs(np.fft.rfft(decoded[4800:]))
    assert abs(np.argmax(spectrum) * 48000 / (decoded.size - 4800) - 440.0) < 5.0
    rms = float(np.sqrt(np.mean(decoded[4800:] ** 2)))
    assert 0.15 < rms < 0.26  # a 0.3 sine has rms 0.21


@pytest.mark.asyncio
async def test_quiet_frames_go_as_one_silence_packet_and_speech_after_them_decodes_clean():
    """A quiet agent costs no encode; the tone after the quiet decodes as the tone, the quiet as silence."""
    sound = (tone(400, hz=440.0, level=0.3, rate=48000) * 32767).astype(np.int16)
    script = [sound[i : i + 960] for i in range(0, sound.size, 960)]
    script = script + [np.zeros(960, np.int16)] * 30 + script
    frames = iter(script)
    track = PlayoutTrack(lambda: next(frames))
    packets = await _packets(track, len(script))
    assert track.encoded == 2 * 20 + 1  # the tone twice, and one silent frame before its return
    quiet = packets[20:50]
    assert len({bytes(p) for p in quiet}) == 1 and quiet[0].size < min(p.size for p in packets[:20]) / 2
    assert [p.pts for p in packets] == [960 * n for n in range(len(script))]

    decoder = OpusDecoder()
    decoded = [frame_to_mono_f32(f) for p in packets for f in decoder.decode(JitterFrame(bytes(p), p.pts))]
    rms = [float(np.sqrt(np.mean(d**2))) for d in decoded]
    assert max(rms[22:50]) < 0.001  # silence, once the tone's tail has passed
    again = np.concatenate(decoded[52:70])
    spectrum = np.abs(np.fft.rfft(again))
    assert abs(np.argmax(spectrum) * 48000 / again.size - 440.0) < 5.0
    assert 0.15 < float(np.sqrt(np.mean(again**2))) < 0.26


def test_frame_to_mono_takes_one_channel_of_any_layout():
    mono = (np.arange(960) - 480).astype(np.int16) * 60
    packed = av.AudioFrame.from_ndarray(np.repeat(mono, 2).reshape(1, -1), format="s16", layout="stereo")
    planar = av.AudioFrame.from_ndarray(np.stack([mono, mono]).astype(np.float32) / 32768.0, format="fltp",
                                        layout="stereo")
    expected = mono.astype(np.float32) / 32768.0
    for frame in (packed, planar):
        out = frame_to_mono_f32(frame)
        assert out.dtype == np.float32 and out.shape == (960,)
        np.testing.assert_allclose(out, expected, atol=1e-6)


@pytest.mark.asyncio
async def test_the_data_channel_joins_transcript_deltas_and_sends_metrics_only_on_change(host_address, monkeypatch):
    monkeypatch.setattr(peer_session, "METRICS_INTERVAL_S", 0.2)
    backend = EchoBackend()
    http, app = await serve(backend, host_address)
    client = ClientPeer(host_address, frames_of(tone(30000, rate=48000)))  # caller audio all along: input_added_ms moves
    metrics = lambda: [m for m in client.messages if m["type"] == "metrics"]  # noqa: E731
    try:
        await client.connect(http)
        await until(lambda: len(metrics()) == 1, 10, "the first metrics message when the channel opens")
        session = app[WEBRTC_PEERS].sessions[client.pc_id]
        await until(lambda: session.audio.figures.last("input_added_ms") is not None, 10, "caller audio")
        # The caller's audio is decoded on the loop by the session's reader, in aiortc's jitter buffer's
        # and decoder queue's place.
        receiver = next(t.receiver for t in session.pc.getTransceivers() if t.kind == "audio")
        assert receiver._RTCRtpReceiver__decoder_queue is session.caller_reader
        assert receiver._RTCRtpReceiver__jitter_buffer is session.caller_reader
        seen = len(session.audio.figures.recent("input_added_ms"))
        await until(lambda: len(session.audio.figures.recent("input_added_ms")) >= seen + 25, 10,
                       "more caller frames (0.5 s, two metrics periods)")
        assert len(metrics()) == 1  # input_added_ms changing every frame does not resend

        session.audio.figures.record("turn_ms", 321.0)
        await until(lambda: len(metrics()) == 2, 5, "metrics after a figure the page shows changed")
        assert metrics()[-1]["latency"]["turn_ms"]["last"] == 321.0
        client.channel.send('{"type": "metrics.request"}')
        await until(lambda: len(metrics()) == 3, 5, "metrics on request")

        conversation = backend.conversations[0]
        words = [f"word{n} " for n in range(40)]
        loop = asyncio.get_running_loop()
        first_word_at = loop.time()
        for word in words:  # a word every 25 ms or more, as a model speaks them
            conversation.emit(ResponseTranscriptDelta(response_id="r1", item_id="i1", delta=word))
            await asyncio.sleep(0.025)
        speaking_s = loop.time() - first_word_at  # longer on a busy machine: the bound below follows it
        conversation.emit(ResponseTranscriptDone(response_id="r1", item_id="i1", transcript="".join(words)))
        done = "response.output_audio_transcript.done"
        await until(lambda: done in client.message_types(), 5, "the transcript's end")
        deltas = [m for m in client.messages if m["type"] == "response.output_audio_transcript.delta"]
        assert "".join(d["delta"] for d in deltas) == "".join(words)  # nothing lost, in order
        # At most one message per 250 ms of the words' span (plus the first and the flush at
        # the end), not one per word.
        assert 2 <= len(deltas) <= int(speaking_s / 0.25) + 2 < len(words), (len(deltas), speaking_s)
        assert client.message_types().index(done) > max(i for i, m in enumerate(client.messages) if m in deltas)
    finally:
        await client.close()
        await until(lambda: not app[WEBRTC_PEERS].sessions, 10, "the server to free the peer")
        await http.close()


def test_the_voice_bitrate_is_a_setting():
    from duplex_agent.agent.app.settings import Settings

    assert Settings().opus_bitrate == 32000
    assert Settings.from_env({"DUPLEX_OPUS_BITRATE": "24000"}).opus_bitrate == 24000
