"""A realtime-websocket caller on our server, and what it makes of a reply from the scripted model.

The scripted model (devtools/omni_peer/scripted_model.py) says ``reply N <words>`` and plays
each word as a tone at ``reply_tone_hz(N)``; ``Reply`` recovers the pitch, the duration and
the text from the events, so a test can tell which reply it heard and how much of it.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.conformance.omni_client import OmniClient, pcm16

REPLY_TIMEOUT_S = 30.0


def reply_tone_hz(index: int) -> float:
    """devtools.omni_peer.scripted_model.reply_tone_hz (that module lives in the peer's venv)."""
    return 300.0 + 150.0 * ((max(index, 1) - 1) % 6)


@dataclass
class Reply:
    response_id: str | None = None
    status: str | None = None
    transcript: str = ""
    text: str = ""
    rates: set[int] = field(default_factory=set)
    chunks: list[np.ndarray] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    @property
    def rate(self) -> int:
        assert len(self.rates) == 1, f"audio deltas at several rates: {self.rates}"
        return next(iter(self.rates))

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.rate if self.chunks else 0.0

    def seconds_after(self, kind: str) -> float:
        """Audio that came after the reply's first ``kind`` event (none when it has no such event)."""
        names = self.names
        if kind not in names:
            return 0.0
        later = names[names.index(kind):].count("response.output_audio.delta")  # the last chunks
        return sum(chunk.size for chunk in self.chunks[len(self.chunks) - later:]) / self.rate if later else 0.0

    def pitch_hz(self) -> float:
        audio = self.audio
        spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
        return float(np.fft.rfftfreq(len(audio), 1 / self.rate)[int(np.argmax(spectrum))])

    @property
    def names(self) -> list[str]:
        return [event["type"] for event in self.events]

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        kind = event["type"]
        if kind == "response.created":
            self.response_id = event["response"]["id"]
        elif kind == "response.output_audio.delta":
            raw = np.frombuffer(base64.b64decode(event["delta"]), "<i2")
            self.chunks.append(raw.astype(np.float32) / 32768.0)
            self.rates.add(int(event["sample_rate_hz"]))
        elif kind == "response.output_audio_transcript.done":
            self.transcript = event["transcript"]
        elif kind in ("response.output_text.done", "response.text.done"):
            self.text = event.get("text", "")
        elif kind == "response.done":
            self.status = event["response"]["status"]


async def next_reply(client: OmniClient, *, timeout: float = REPLY_TIMEOUT_S, stop_after: str | None = None) -> Reply:
    """The events of the next response, up to its ``response.done`` (or up to ``stop_after``)."""
    reply = Reply()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise AssertionError(f"no {stop_after or 'response.done'} within {timeout} s; got {reply.names[-12:]}")
        event = await client.recv(left)
        if event["type"] == "error":
            reply.events.append(event)
            raise AssertionError(f"error while waiting for a reply: {event}")
        if reply.response_id is None and event["type"] != "response.created":
            continue
        reply.add(event)
        if event["type"] in ("response.done", stop_after):
            return reply


async def say(client: OmniClient, samples: np.ndarray, *, chunk_ms: float = 20.0, realtime: bool = False) -> None:
    """Append 16 kHz float32 audio as pcm16 with the per-append format vLLM-Omni's clients send;
    ``realtime`` paces it as a live caller would (a server VAD's input path is sized for that)."""
    step = int(16 * chunk_ms)
    loop = asyncio.get_running_loop()
    began = loop.time()
    for number, start in enumerate(range(0, len(samples), step), 1):
        await client.send({"type": "input_audio_buffer.append", "audio": pcm16(samples[start:start + step]),
                           "format": "pcm16", "sample_rate_hz": 16000})
        if realtime:  # on the clock, as a microphone: a late wake-up is made up, never added to the audio's time
            await asyncio.sleep(max(0.0, began + number * chunk_ms / 1000 - loop.time()))


async def acknowledge(client: OmniClient, reply: Reply) -> None:
    """What a caller that played the whole reply tells the server."""
    played_ms = int(reply.seconds * 1000)
    await client.send({"type": "playback.ack", "response_id": reply.response_id, "played_ms": played_ms,
                       "committed_ms": played_ms})
