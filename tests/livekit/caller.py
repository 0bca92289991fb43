"""A caller in a LiveKit room, on the real livekit SDK: speaks, listens, reads transcripts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from livekit import rtc

from tests.integration.conftest import Microphone


@dataclass
class Transcript:
    sender: str
    text: str
    attributes: dict[str, str]
    #: How many agent audio frames the caller had received when this arrived.
    at_frame: int = 0

    @property
    def final(self) -> bool:
        return self.attributes.get("lk.transcription_final") == "true"


class LiveKitCaller:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.room = rtc.Room()
        self.mic = Microphone()
        self.source = rtc.AudioSource(48000, 1, queue_size_ms=100)
        self.received: list[np.ndarray] = []
        self.transcripts: list[Transcript] = []
        self.agent_states: list[str] = []
        self._tasks: list[asyncio.Task] = []
        self.room.on("track_subscribed", self._on_track)
        self.room.on("participant_attributes_changed", self._on_attributes)
        self.room.register_text_stream_handler("lk.transcription", self._on_text_stream)

    async def join(self, *, publish: bool = True) -> None:
        await asyncio.wait_for(self.room.connect(self.url, self.token), 20)
        if publish:
            await self.publish_microphone()

    async def publish_microphone(self, name: str = "mic", source: rtc.TrackSource.ValueType = rtc.TrackSource.SOURCE_MICROPHONE) -> None:
        track = rtc.LocalAudioTrack.create_audio_track(name, self.source)
        await self.room.local_participant.publish_track(track, rtc.TrackPublishOptions(source=source))
        self._tasks.append(asyncio.create_task(self._feed()))

    async def _feed(self) -> None:
        while True:
            frame = self.mic.next_frame()
            await self.source.capture_frame(rtc.AudioFrame(frame.tobytes(), 48000, 1, 960))

    def _on_track(self, track: rtc.Track, publication, participant) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO:
            self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _listen(self, track: rtc.Track) -> None:
        stream = rtc.AudioStream(track, sample_rate=48000, num_channels=1)
        async for event in stream:
            self.received.append(np.frombuffer(event.frame.data, np.int16).astype(np.float32) / 32768)

    def _on_attributes(self, changed: dict[str, str], participant) -> None:
        if "lk.agent.state" in changed:
            self.agent_states.append(changed["lk.agent.state"])

    def _on_text_stream(self, reader: rtc.TextStreamReader, sender: str) -> None:
        at_frame = len(self.received)

        async def read() -> None:
            text = await reader.read_all()
            self.transcripts.append(Transcript(sender, text, dict(reader.info.attributes or {}), at_frame))

        self._tasks.append(asyncio.create_task(read()))

    def loud_frames(self, since: int = 0, threshold: float = 0.02) -> int:
        return sum(float(np.sqrt(np.mean(f**2))) > threshold for f in self.received[since:])

    async def leave(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self.room.disconnect(), 10)
