"""aiortc media glue: a paced outgoing track that encodes its own Opus, and the caller's audio decoded on the loop."""

from __future__ import annotations

import asyncio
import fractions
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import cast

import av
import numpy as np
from aiortc import RTCRtpCodecParameters, RTCRtpReceiver
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from duplex_agent.webrtc.direct.aiortc_receiver import take_decoder_queue
from duplex_agent.webrtc.direct.libopus import OpusEncoder
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES, SAMPLE_RATE

logger = logging.getLogger("duplex_agent.webrtc")

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


class CallerAudioReader:
    """The caller's audio through aiortc's own jitter buffer (``receive_buffer=aiortc``, kept
    to compare with ``caller_receive.AdaptiveCallerAudioReader``): decodes the caller's Opus
    on the event loop as aiortc's receiver hands it over, and gives each frame to ``sink``
    as mono float32: no thread hop and no task per frame.

    aiortc decodes on a thread of its own per receiver and hands every frame back to
    the loop as a new task; its receiver passes each encoded frame to that thread
    through its decoder queue. This reader takes that queue's place before the receiver
    starts (``aiortc_receiver.take_decoder_queue``): ``put`` decodes in line (libopus,
    ~30 us a frame). aiortc's thread still starts, and waits in ``get`` until the
    receiver stops (``put(None)``), which also ends the call as the track's end did.
    """

    def __init__(
        self,
        receiver: RTCRtpReceiver,
        sink: Callable[[np.ndarray, int], None],
        *,
        on_ended: Callable[[], None] | None = None,
    ) -> None:
        self._sink = sink
        self._on_ended = on_ended
        self._loop = asyncio.get_running_loop()
        self.last_packet_at: float | None = None  # the loop's clock at the caller's last frame (media timeout)
        self._decoder: Decoder | None = None
        self._codec_name = ""
        self._stopped = threading.Event()
        take_decoder_queue(receiver, self)

    # ---- the receiver's side (on the loop) ----

    def put(self, task: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if task is None:  # the receiver stops
            if not self._stopped.is_set():
                self._stopped.set()
                logger.debug("caller track ended")
                if self._on_ended is not None:
                    self._on_ended()
            return
        if self._stopped.is_set():  # closed by its owner: the call is going
            return
        codec, encoded = task
        self.last_packet_at = self._loop.time()
        try:
            if codec.name != self._codec_name:
                self._decoder, self._codec_name = get_decoder(codec), codec.name
            assert self._decoder is not None
            frames = self._decoder.decode(encoded)
        except av.FFmpegError as exc:  # keep the decoder's state: the next frame decodes
            logger.debug("caller audio frame failed to decode: %s", exc)
            return
        # An audio codec's decoder; aiortc's Decoder.decode is typed for any media (list[av.frame.Frame]).
        for frame in cast(list[av.AudioFrame], frames):
            try:
                self._sink(frame_to_mono_f32(frame), frame.sample_rate)
            except Exception:
                logger.exception("caller audio sink failed")

    # ---- aiortc's decoder thread ----

    def get(self) -> None:
        self._stopped.wait()
        return None

    async def close(self) -> None:
        self._stopped.set()  # lets aiortc's idle thread go; the receiver's own stop joins it
