"""aiortc's own jitter buffer on the caller's side of a direct call: the comparison the benches
hold our receive buffer (``webrtc.direct.caller_receive``) against. Not in the product.

``CallerAudioReader`` decodes the caller's Opus on the event loop as aiortc's receiver hands it
over (its jitter buffer kept) and gives each frame to ``sink`` as mono float32: no thread hop
and no task per frame. aiortc decodes on a thread of its own per receiver and hands every frame
back to the loop as a new task; its receiver passes each encoded frame to that thread through
its decoder queue. This reader takes that queue's place before the receiver starts
(``aiortc_receiver.take_decoder_queue``): ``put`` decodes in line (libopus, ~30 us a frame).
aiortc's thread still starts, and waits in ``get`` until the receiver stops (``put(None)``),
which also ends the call as the track's end did.

``python -m bench.aiortc_receive serve ...`` runs the worker's CLI with every direct call's
caller read this way (``bench.lossy_network``'s ``aiortc`` buffer).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import av
import numpy as np
from aiortc import RTCRtpCodecParameters, RTCRtpReceiver
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame

from duplex_agent.webrtc.direct.aiortc_receiver import take_decoder_queue
from duplex_agent.webrtc.direct.tracks import frame_to_mono_f32

logger = logging.getLogger("bench.aiortc_receive")


class CallerAudioReader:
    """The caller's audio through aiortc's own jitter buffer, decoded on the loop (see the module)."""

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
        for frame in frames:
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


def use_aiortc_buffer() -> None:
    """Every direct call made after this reads its caller through ``CallerAudioReader``."""
    from duplex_agent.webrtc.direct import peer_session

    def reader(receiver: RTCRtpReceiver, sink: Callable[[np.ndarray, int], None], *, call_id: str,
               on_ended: Callable[[], None] | None = None) -> Any:
        return CallerAudioReader(receiver, sink, on_ended=on_ended)

    peer_session.AdaptiveCallerAudioReader = reader  # type: ignore[assignment,misc]


if __name__ == "__main__":
    from duplex_agent.agent.app.cli import main

    use_aiortc_buffer()
    raise SystemExit(main())
