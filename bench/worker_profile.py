"""Where a worker's time goes: py-spy samples of its threads, as shares of named parts.

``start_profile``/``finish_profile`` sample a running worker; ``profile_shares`` turns py-spy's raw
(collapsed stacks) output into shares, and is pure.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: py-spy samples every thread that is runnable, and a thread woken in a blocking call stays runnable
#: there until it gets a CPU: on a busy machine, that is much of what it records for the worker's loops.
#: Such samples (their innermost frame a blocking call) are a wait, not work, and count apart.
WAITING = "woken in a wait, not yet run (not work)"
WAIT_FRAME = re.compile(r"^(?:\w+\.)?(?:select|poll|wait|_wait_for_tstate_lock|acquire) \(.*"
                        r"(?:selectors|threading|asyncio/\w+|concurrent/futures/\w+)\.py")

#: Innermost match wins: a sample counts for the first part whose pattern its stack meets, leaf first.
#: py-spy names a frame "[Class.]function (path:line)"; libopus and soxr run inside the Python frame calling them.
PROFILE_PARTS = tuple((name, tuple(re.compile(p) for p in patterns)) for name, patterns in (
    ("Opus encode", (r"\brecv \(.*webrtc/direct/tracks\.py", r"\bencode \(.*codecs/opus\.py")),
    ("Opus decode", (r"\bdecoder_worker \(", r"\bput \(.*webrtc/direct/tracks\.py", r"\bdecode \(.*codecs/opus\.py")),
    ("Silero VAD (onnxruntime)", (r"onnxruntime", r"models/vad\.py")),
    ("end-of-turn model", (r"models/end_of_turn\.py",)),
    ("resampling (soxr)", (r"soxr", r"protocol/audio\.py")),
    ("RTP audio level (aiortc)", (r"\bcompute_audio_level_dbov",)),
    ("data channel (SCTP/DTLS)", (r"rtcsctptransport\.py", r"rtcdatachannel\.py")),
    ("RTP/SRTP send and receive", (r"rtcrtpsender\.py", r"rtcrtpreceiver\.py", r"rtcdtlstransport\.py",
                                   r"pylibsrtp", r"jitterbuffer\.py", r"aiortc/rtp\.py")),
    ("ICE/UDP", (r"aioice",)),
    ("livekit FFI events", (r"livekit/rtc/_ffi_client\.py", r"livekit/rtc/_utils\.py", r"livekit/ffi_audio\.py",
                            r"livekit/ffi_router\.py", r"livekit/rtc/audio_stream\.py", r"livekit/rtc/audio_source\.py")),
    ("livekit SDK (other)", (r"livekit/rtc/", r"livekit/agents/")),
    ("call audio path", (r"webrtc/media/",)),
    ("session runner + plugin", (r"agent/session/", r"plugins/")),
    ("asyncio loop and wake-ups", (r"asyncio/", r"selectors\.py")),
    ("threads (hand-offs)", (r"threading\.py", r"concurrent/futures")),
))


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the worker (all threads, native frames) for ``seconds``; None without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    command = [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "200",
               "--format", "raw", "--nonblocking", "--output", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.out_path = out  # type: ignore[attr-defined]
    return proc


async def finish_profile(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    await asyncio.to_thread(proc.wait)
    out: Path = proc.out_path  # type: ignore[attr-defined]
    if not out.exists():
        return {}
    return profile_shares(out.read_text(errors="replace"))


def part_of(frames: list[str]) -> str:
    """The PROFILE_PARTS entry of a stack (outermost frame first): the innermost frame that names one."""
    for frame in reversed(frames):
        hit = next((name for name, patterns in PROFILE_PARTS if any(p.search(frame) for p in patterns)), None)
        if hit is not None:
            return hit
    return "other"


def profile_shares(collapsed: str) -> dict[str, float]:
    """Share of samples per PROFILE_PARTS entry from py-spy's raw (collapsed stacks) output."""
    counts: dict[str, float] = {}
    total = 0.0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = float(count_text)
        except ValueError:
            continue
        total += count
        frames = stack.split(";")
        part = WAITING if WAIT_FRAME.match(frames[-1]) else part_of(frames)
        counts[part] = counts.get(part, 0.0) + count
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}
