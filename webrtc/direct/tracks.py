"""aiortc media glue: a paced outgoing track that encodes its own Opus, and decoded frames as mono float32."""

from __future__ import annotations

import asyncio
import fractions
import functools
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from duplex_agent.webrtc.direct.libopus import OpusEncoder
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
#: Further behind than this (a stalled loop), the schedule restarts instead of bursting.
_MAX_LAG_S = 0.2
#: A voice bitrate for mono speech; aiortc's own encoder sends stereo at 96 kb/s.
DEFAULT_OPUS_BITRATE = 32000
#: The loss rate Opus plans its in-band FEC for until the caller's first receiver report
#: (libopus adds FEC only when this is > 0); then the reports set it (``loss_feedback``).
OPUS_EXPECTED_LOSS_PERCENT = 10
#: libopus complexity (0-10, default 10): 5 costs less CPU per frame of speech at the same
#: bitrate (bench.direct_edges), and voice at 32 kb/s does not need the difference.
OPUS_COMPLEXITY = 5


class OpusVoiceEncoder:
    """libopus for one mono 48 kHz voice in 20 ms frames (voip, complexity ``OPUS_COMPLEXITY``),
    whose in-band FEC follows the loss the caller reports (``set_expected_loss``; 0 turns it off)."""

    def __init__(self, bitrate: int = DEFAULT_OPUS_BITRATE, *,
                 expected_loss_percent: int = OPUS_EXPECTED_LOSS_PERCENT) -> None:
        self._opus = OpusEncoder(bitrate, complexity=OPUS_COMPLEXITY, expected_loss_percent=expected_loss_percent)

    def encode(self, samples: np.ndarray) -> bytes:
        """One 20 ms frame of int16 samples -> one Opus packet."""
        return self._opus.encode(samples)

    def set_expected_loss(self, percent: int) -> None:
        self._opus.set_expected_loss(percent)

    @property
    def expected_loss_percent(self) -> int:
        return self._opus.expected_loss_percent

    @property
    def fec(self) -> bool:
        return self._opus.fec


@functools.lru_cache(maxsize=8)
def _steady_silence_packet(bitrate: int) -> bytes:
    """What the voice encoder sends for digital silence once it has settled into it (made once per bitrate)."""
    encoder = OpusVoiceEncoder(bitrate)
    quiet = np.zeros(FRAME_SAMPLES, np.int16)
    packet = b""
    for _ in range(10):
        packet = encoder.encode(quiet)
    return packet


class PlayoutTrack(MediaStreamTrack):
    """Sends one 20 ms frame from ``next_frame`` per deadline, as Opus packets (mono, voice bitrate).

    Deadlines are start + n * 20 ms on the monotonic clock, so sleeps that run
    long do not accumulate drift. The frame is taken at its deadline, so a
    playout clear is heard in the very next frame.

    The track yields encoded ``av.Packet``s, which aiortc's sender only packs: the
    encode (libopus through ``OpusVoiceEncoder``) runs here, on the loop, instead of
    a thread-pool hop per frame into aiortc's stereo 96 kb/s encoder. aiortc adds the
    RTP audio-level header extension only to frames it encodes itself, so this track
    sends none.

    While the agent is quiet (an all-zero frame, most of a call) the packet is the
    encoder's own steady packet for silence, made once: encoding silence cost about
    150 us a frame. Before the first sound after it, the encoder is given one silent
    frame, so its state follows what the caller's decoder has just been decoding.
    """

    kind = "audio"

    def __init__(self, next_frame: Callable[[], np.ndarray], *, bitrate: int = DEFAULT_OPUS_BITRATE) -> None:
        super().__init__()
        self._next_frame = next_frame
        self.encoder = OpusVoiceEncoder(bitrate)
        self._silence = _steady_silence_packet(bitrate)
        self._quiet = False  # the last frame sent was the silence packet
        self._start: float | None = None
        self._frames = 0
        self.encoded = 0  # frames through the encoder (the rest went as the silence packet)

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        while True:
            now = time.monotonic()
            if self._start is None:
                self._start = now
            else:
                self._frames += 1
                deadline = self._start + self._frames * _FRAME_S
                if now - deadline > _MAX_LAG_S:
                    self._start = now - self._frames * _FRAME_S
                elif deadline > now:
                    await asyncio.sleep(deadline - now)
            samples = self._next_frame()
            pts = self._frames * FRAME_SAMPLES
            if not samples.any():
                self._quiet = True
                return self._packet(av.Packet(self._silence), pts)
            if self._quiet:
                self._quiet = False
                self._encode(np.zeros_like(samples))  # catch up with the silence
            return self._packet(av.Packet(self._encode(samples)), pts)

    def _encode(self, samples: np.ndarray) -> bytes:
        self.encoded += 1
        return self.encoder.encode(samples)

    @staticmethod
    def _packet(packet: av.Packet, pts: int) -> av.Packet:
        packet.pts = pts
        packet.time_base = _TIME_BASE
        return packet


def frame_to_mono_f32(frame: av.AudioFrame) -> np.ndarray:
    """A decoded audio frame (s16 or flt, packed or planar, any channels) as mono float32.

    Takes the first channel: a WebRTC voice is mono, and aiortc's Opus decoder
    hands it out as two identical channels, so averaging them would only cost time.
    """
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    first = data[0] if frame.format.is_planar else data.reshape(-1)[::channels]
    if first.dtype == np.int16:
        return first.astype(np.float32) * np.float32(1.0 / 32768.0)
    return first.astype(np.float32, copy=False)
