"""The direct path's per-frame edges, as aiortc ships them against ours: CPU per 20 ms frame, same run.

N simulated calls on one event loop, one frame per call every 20 ms (real pace, so
every hand-off wakes what it would wake in a worker), for a fixed number of frames;
this process's CPU time over that work. CPU time counts only what ran, so the ratio
holds on a loaded machine even where the wall clock does not.

Frames are Piper speech (libopus's cost depends on the signal: it codes speech at 32 kb/s
mono with SILK, which costs more per frame than CELT at 96 kb/s stereo, and in-band FEC
adds to it).

- out: ``aiortc``: the RTP audio level in Python, then aiortc's stereo 96 kb/s Opus
  encoder in the default thread pool (a hop each way), as aiortc's sender does with a
  frame; ``ours``: the playout track's mono 32 kb/s Opus (in-band FEC) on the loop.
- in: ``aiortc``: the receiver's decoder thread, a task per frame back to the loop, the
  track's queue, both channels averaged; ``ours``: ``CallerAudioReader`` decoding on
  the loop in place of the decoder queue, one channel taken.

Run: python -m bench.direct_edges [--calls 16] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import queue
import threading
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc import RTCRtpCodecParameters
from aiortc.codecs.opus import OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpreceiver import decoder_worker
from aiortc.rtp import compute_audio_level_dbov

from bench.aiortc_receive import CallerAudioReader
from duplex_agent.webrtc.direct.tracks import OpusVoiceEncoder

RATE = 48000
OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)
SPEECH_TEXT = "Please tell me a long story about the sea and the ships, and the old songs the crew sang."
_speech: list[np.ndarray] = []


def speech() -> np.ndarray:
    """Piper speaking SPEECH_TEXT, int16 at 48 kHz, whole 20 ms frames (libopus costs differ for speech and tones)."""
    if not _speech:
        from devtools.speech import speak

        audio = (np.clip(speak(SPEECH_TEXT, RATE), -1.0, 1.0) * 32767).astype(np.int16)
        _speech.append(audio[: audio.size // 960 * 960])
    return _speech[0]


def _samples(n: int) -> np.ndarray:
    frames = speech().size // 960
    return speech()[(n % frames) * 960 : (n % frames + 1) * 960]


def _frame(n: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(_samples(n).reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = RATE
    frame.pts = n * 960
    frame.time_base = fractions.Fraction(1, RATE)
    return frame


def _mean_of_channels(frame: av.AudioFrame) -> np.ndarray:
    """The caller's frame as it was taken before: every channel averaged."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    data = data.reshape(channels, -1).T if frame.format.is_planar else data.reshape(-1, channels)
    return (data.astype(np.float32) / 32768.0).mean(axis=1)


async def _paced(calls: int, seconds: float, one: Callable[[int, int], object]) -> tuple[float, int]:
    """Call ``one(call, n)`` for every call each 20 ms; (CPU seconds, frames) over the run."""
    loop = asyncio.get_running_loop()
    ticks = int(seconds * 50)
    cpu0, start = time.process_time(), loop.time()
    pending: list[object] = []
    for n in range(ticks):
        delay = start + n * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        for call in range(calls):
            result = one(call, n)
            if asyncio.iscoroutine(result):
                pending.append(asyncio.ensure_future(result))
        if pending:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.sleep(0.05)  # what is still in flight lands
    return time.process_time() - cpu0, ticks * calls


async def outgoing(mode: str, calls: int, seconds: float) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    if mode == "aiortc":
        encoders = [OpusEncoder() for _ in range(calls)]

        async def one(call: int, n: int) -> None:
            frame = _frame(n)
            compute_audio_level_dbov(frame)
            await loop.run_in_executor(None, encoders[call].encode, frame, False)

        return await _paced(calls, seconds, one)
    ours = [OpusVoiceEncoder() for _ in range(calls)]
    return await _paced(calls, seconds, lambda call, n: ours[call].encode(_samples(n)))


def _packets(frames: int) -> list[bytes]:
    encoder = OpusEncoder()  # what a browser sends: stereo Opus
    out = []
    for n in range(frames):
        payloads, _ = encoder.encode(_frame(n))
        out.extend(payloads)
    return out


async def incoming(mode: str, calls: int, seconds: float) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    packets = _packets(speech().size // 960)
    got = [0]
    if mode == "aiortc":
        inputs = [queue.Queue() for _ in range(calls)]
        outputs: list[asyncio.Queue] = [asyncio.Queue() for _ in range(calls)]
        threads = [threading.Thread(target=decoder_worker, args=(loop, q, out, threading.Event()), daemon=True)
                   for q, out in zip(inputs, outputs, strict=True)]
        for thread in threads:
            thread.start()

        async def read(out: asyncio.Queue) -> None:
            while (frame := await out.get()) is not None:
                _mean_of_channels(frame)
                got[0] += 1

        readers = [asyncio.create_task(read(out)) for out in outputs]
        result = await _paced(calls, seconds, lambda call, n: inputs[call].put(
            (OPUS, JitterFrame(packets[n % len(packets)], n * 960))))
        for q in inputs:
            q.put(None)
        await asyncio.gather(*readers)
        return result

    class Receiver:  # what CallerAudioReader needs of aiortc's receiver before it starts
        _RTCRtpReceiver__started = False

    def sink(samples: np.ndarray, rate: int) -> None:
        got[0] += 1

    readers = [CallerAudioReader(Receiver(), sink) for _ in range(calls)]  # type: ignore[arg-type]
    return await _paced(calls, seconds, lambda call, n: readers[call].put((OPUS, JitterFrame(packets[n % len(packets)], n * 960))))


async def run(calls: int, seconds: float) -> list[tuple[str, float, float]]:
    rows = []
    for name, bench in (("out: encode a 20 ms frame", outgoing), ("in: decode a 20 ms frame", incoming)):
        per_frame: dict[str, list[float]] = {"aiortc": [], "ours": []}
        for _ in range(2):  # A, B, A, B
            for mode in ("aiortc", "ours"):
                cpu, frames = await bench(mode, calls, seconds)
                per_frame[mode].append(1e6 * cpu / frames)
        a, b = float(np.median(per_frame["aiortc"])), float(np.median(per_frame["ours"]))
        print(f"   {name:28} aiortc {a:7.1f} us, ours {b:7.1f} us CPU per frame: ours/aiortc {b / a:.2f} "
              f"(runs {', '.join(f'{v:.0f}' for v in per_frame['aiortc'])} | "
              f"{', '.join(f'{v:.0f}' for v in per_frame['ours'])})", flush=True)
        rows.append((name, a, b))
    total_a, total_b = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"   both edges, per call at 50 frames/s: aiortc {total_a * 50 / 1e4:.2f}% of a core, "
          f"ours {total_b * 50 / 1e4:.2f}% ({total_b / total_a:.2f}x)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    print(f"== the direct path's per-frame edges: {args.calls} calls on one loop, aiortc's way vs ours ==", flush=True)
    asyncio.run(run(args.calls, args.seconds))


if __name__ == "__main__":
    main()
