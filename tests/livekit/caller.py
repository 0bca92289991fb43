"""A caller in a LiveKit room, on the real livekit SDK: speaks, listens, reads transcripts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from livekit import rtc

from devtools.speech import speak, transcribe
from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource, CallerAudioStream
from duplex_agent.webrtc.livekit.ffi_router import FfiRouter
from tests.integration.conftest import Microphone
from tests.support.waits import until

#: Quiet frames (10 ms each) a caller waits for after the agent says it stopped speaking: the
#: last of its reply is still on its way through the SFU and the caller's jitter buffer, and
#: behind a stalled test loop its frames are read late, after the state change that followed them.
TAIL_FRAMES = 60


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


@dataclass
class Reply:
    #: The agent's final transcripts of it (``lk.transcription`` in this caller's room), joined: a
    #: reply that livekit-agents' duplex adapter split into bursts (a loop stalled 0.8 s) comes as several.
    transcript: str
    #: What this caller heard, as Whisper transcribes it.
    heard: str
    #: Loud 10 ms frames this caller received from its words to the reply's end.
    loud_frames: int


class LiveKitCaller:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.room = rtc.Room()
        self.mic = Microphone()
        # Audio in and out through the worker's FFI router: with the SDK's own stream and
        # capture, each of several callers in this process wakes for every other's frames, and
        # the test process (which also runs the loopback SFU) starves its own media.
        self.source = AgentVoiceSource(48000, 1, queue_size_ms=100)
        self.received: list[np.ndarray] = []
        self.received_at: list[float] = []  # when each of them was read (time.time(), for a failure's reader)
        self.transcripts: list[Transcript] = []
        self.agent_states: list[str] = []
        #: (state, frames received when it arrived)
        self.state_log: list[tuple[str, int]] = []
        self.agent_left = False
        self._tasks: list[asyncio.Task] = []
        self._feed_task: asyncio.Task | None = None
        self.frames_fed = 0  # 20 ms microphone frames the source has taken
        self.room.on("track_subscribed", self._on_track)
        self.room.on("participant_attributes_changed", self._on_attributes)
        self.room.on("participant_disconnected", self._on_participant_left)
        self.room.register_text_stream_handler("lk.transcription", self._on_text_stream)

    async def join(self, *, publish: bool = True) -> None:
        await asyncio.wait_for(self.room.connect(self.url, self.token), 20)
        FfiRouter.shared().own_room(self.room)  # as the worker does: no wake-ups for the other callers' events
        if publish:
            await self.publish_microphone()

    async def publish_microphone(self, name: str = "mic", source: rtc.TrackSource.ValueType = rtc.TrackSource.SOURCE_MICROPHONE) -> None:
        track = rtc.LocalAudioTrack.create_audio_track(name, self.source.source)
        await self.room.local_participant.publish_track(track, rtc.TrackPublishOptions(source=source))
        self._feed_task = asyncio.create_task(self._feed())
        self._tasks.append(self._feed_task)

    async def _feed(self) -> None:
        while True:
            frame = self.mic.next_frame()
            await self.source.capture_frame(rtc.AudioFrame(frame.tobytes(), 48000, 1, 960))
            self.frames_fed += 1

    def microphone_live(self) -> bool:
        """True while the microphone feeds the track; AssertionError, with why, once it stopped
        (the agent would hear nothing more, and a wait for its reply would only time out)."""
        task = self._feed_task
        if task is not None and task.done():
            why = "cancelled" if task.cancelled() else repr(task.exception())
            raise AssertionError(f"the caller's microphone stopped: {why}")
        return True

    def _on_track(self, track: rtc.Track, publication, participant) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO:
            self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _listen(self, track: rtc.Track) -> None:
        stream = CallerAudioStream(track, 48000, frame_size_ms=10)
        try:
            async for frame in stream:
                self.received.append(np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768)
                self.received_at.append(time.time())
        finally:
            await stream.aclose()

    def _on_attributes(self, changed: dict[str, str], participant) -> None:
        if "lk.agent.state" in changed:
            self.agent_states.append(changed["lk.agent.state"])
            self.state_log.append((changed["lk.agent.state"], len(self.received)))

    def _on_participant_left(self, participant: rtc.RemoteParticipant) -> None:
        if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            self.agent_left = True

    def _on_text_stream(self, reader: rtc.TextStreamReader, sender: str) -> None:
        at_frame = len(self.received)

        async def read() -> None:
            try:
                text = await reader.read_all()
            except rtc.StreamError:  # the caller left mid-stream (one opened as it was leaving)
                return
            self.transcripts.append(Transcript(sender, text, dict(reader.info.attributes or {}), at_frame))

        self._tasks.append(asyncio.create_task(read()))

    def agent_replies(self) -> list[Transcript]:
        """The agent's final transcripts that say something (a reply cut short before any of it was
        heard gets an empty final, which may arrive after the next question was asked)."""
        return [t for t in self.transcripts if t.final and t.sender.startswith("agent-") and t.text.strip()]

    def listening_after_speaking(self, frame: int) -> int | None:
        """When the agent is listening now, having spoken since ``frame``: the frame count at which it went quiet."""
        states = [(state, at) for state, at in self.state_log if at >= frame]
        if states and states[-1][0] == "listening" and any(state == "speaking" for state, _ in states):
            return states[-1][1]
        return None

    async def say_and_hear(self, text: str, timeout: float = 60, *, whole: Callable[[], bool] | None = None) -> str:
        """Say ``text`` and return what this caller heard of the reply, as Whisper transcribes it."""
        return (await self.say_and_listen(text, timeout, whole=whole)).heard

    async def say_and_listen(self, text: str, timeout: float = 60, *,
                             whole: Callable[[], bool] | None = None) -> Reply:
        """Say ``text``; the agent's reply as this caller got it: its transcript and its audio.

        Waits on the agent's own signals: its final transcript (all of the reply has reached the
        worker's playout), then ``lk.agent.state`` at listening after speaking (the playout ran
        dry), then the frames still on their way, until ``TAIL_FRAMES`` of quiet; a state change
        meanwhile (one that was in flight on the signalling path) starts that wait again.
        ``whole``: the agent's own record says the whole reply was said; a LiveKit Agents app says a
        reply whose audio came with gaps (a starved or resuming backend) in pieces, each a reply of
        its own to the room, so the first piece's end is not the reply's."""
        start, replies, fed = len(self.received), len(self.agent_replies()), self.frames_fed
        self.mic.say(speak(text, 48000, before_ms=300, after_ms=1200))
        try:
            await until(lambda: self.microphone_live() and len(self.agent_replies()) > replies, timeout,
                           "the agent's reply")
        except AssertionError as exc:  # where it stopped: the microphone, the agent's audio, its states
            raise AssertionError(f"{exc}: {self.frames_fed - fed} microphone frames sent since, "
                                 f"{self.loud_frames(start)} loud frames heard, states {self.state_log[-6:]}") from None
        while True:
            if whole is not None:
                await until(whole, timeout, "the whole reply, by the agent's own record")
            try:
                await until(lambda: self.listening_after_speaking(start) is not None, timeout,
                               "the agent to finish speaking")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: states {self.state_log}") from None
            stopped = self.listening_after_speaking(start)
            await until(lambda: len(self.received) >= stopped + TAIL_FRAMES  # noqa: B023 (called within this iteration)
                           and not self.loud_frames(len(self.received) - TAIL_FRAMES), timeout,
                           "the reply's last frames")
            if self.listening_after_speaking(start) == stopped:
                audio = np.concatenate(self.received[start:])
                transcript = " ".join(t.text.strip() for t in self.agent_replies()[replies:])
                return Reply(transcript, transcribe(audio, 48000), self.loud_frames(start))

    def loud_frames(self, since: int = 0, threshold: float = 0.02) -> int:
        return sum(_loud(f, threshold) for f in self.received[since:])

    def first_loud_frame(self, since: int = 0, threshold: float = 0.02) -> int | None:
        """The index of the first loud frame from ``since`` on (the agent's audio, not its state
        attribute, which comes by the signalling path and may land well before or after it)."""
        return next((i for i in range(since, len(self.received)) if _loud(self.received[i], threshold)), None)

    async def leave(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self.room.disconnect(), 10)


def _loud(frame: np.ndarray, threshold: float) -> bool:
    return float(np.sqrt(np.mean(frame**2))) > threshold
