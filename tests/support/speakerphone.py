"""A speakerphone call against one call path, in process and paced frame by frame: the agent's
spoken replies go out, come back through an ``EchoPath`` into the caller's microphone, and the
caller may talk over them. Deterministic (no clock, no network), so a test or a bench can count
what the echo does over many replies.

Each 20 ms step: the caller's microphone (own speech + echo) goes in with ``push_caller_frame``,
then the agent's next frame comes out and plays into the room. A ``reply`` is a completed
response with ``audio`` (the agent's voice); the step loop runs until it has played out, or was
cut, plus the echo's ring-out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from duplex_agent.agent.protocol.events import (
    ClientEvent,
    InputAudioBufferAppend,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
)
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from tests.support.echo import EchoPath
from tests.support.echo_caller import EchoMicrophone

RATE = 48000
FRAME_MS = 20.0
CAPS = DuplexCapabilities(plugin_id="speakerphone", input_sample_rate=16000, unit_samples=1280,
                          output_sample_rate=24000, max_sessions=1)
#: The agent's frames go quiet at this (int16): the pause's silence and the cut are exact zeros.
QUIET = 1
#: What is heard after a reply ends, so its echo's ring-out reaches the caller path too.
RING_OUT_FRAMES = 25


class ReplyingConversation(Conversation):
    """A model that says what the test tells it to (``reply``); records what is sent to it."""

    session_id = "speakerphone"
    capabilities = CAPS

    def __init__(self) -> None:
        self.sent: list[ClientEvent] = []
        self._events: asyncio.Queue[ServerEvent | None] = asyncio.Queue()
        self._ids = itertools.count(1)

    def send(self, event: ClientEvent) -> None:
        self.sent.append(event)

    async def events(self) -> AsyncIterator[ServerEvent]:
        while (event := await self._events.get()) is not None:
            yield event

    async def close(self, reason: str = "client_closed") -> None:
        self._events.put_nowait(None)

    def reply(self, audio: np.ndarray, rate: int) -> str:
        """A whole response saying ``audio``, in 100 ms deltas; its id."""
        rid = f"r{next(self._ids)}"
        self._events.put_nowait(ResponseCreated(response_id=rid, item_id="i-" + rid))
        step = rate // 10
        for at in range(0, audio.size, step):
            piece = audio[at:at + step]
            self._events.put_nowait(ResponseAudioDelta(
                response_id=rid, item_id="i-" + rid, audio=piece, sample_rate=rate,
                audio_start_ms=1000.0 * at / rate, audio_ms=1000.0 * piece.size / rate))
        self._events.put_nowait(ResponseAudioDone(response_id=rid, item_id="i-" + rid))
        self._events.put_nowait(ResponseDone(response_id=rid, status="completed"))
        return rid

    def cancelled(self, rid: str) -> bool:
        return any(isinstance(e, ResponseCancel) and e.response_id == rid for e in self.sent)

    def heard_since(self, index: int) -> np.ndarray:
        """The caller audio the model was given since ``sent[index]`` (16 kHz)."""
        chunks = [e.audio for e in self.sent[index:] if isinstance(e, InputAudioBufferAppend)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


@dataclass
class ReplyHeard:
    """One reply as the call went: cut or not, its pauses, and for a barge-in the time from the
    interruption's first sound to the agent quiet at the caller."""

    cancelled: bool
    played_ms: float  # of the reply, what went out to the caller
    pauses: int
    false_pauses: int
    withheld: int
    onset_to_quiet_ms: float | None = None
    kept_db: float | None = None  # the interruption's level as the model got it, over what was said


class SpeakerphoneCall:
    def __init__(self, path: CallAudioPath, conversation: ReplyingConversation, echo: EchoPath | None) -> None:
        self.path, self.conversation = path, conversation
        self.microphone = EchoMicrophone(echo)
        self._heard: list[np.ndarray] = []
        self.microphone.listen_to(self._heard)
        self.steps = 0

    def step(self) -> np.ndarray:
        """One 20 ms step: the microphone in, the agent's frame out (and into the room)."""
        self.path.push_caller_frame(self.microphone.next_mono(), RATE)
        out = self.path.next_frame()
        self._heard.append(out.astype(np.float32) / 32767.0)
        self.steps += 1
        return out

    async def reply(self, audio: np.ndarray, rate: int, *, interruption: np.ndarray | None = None,
                    interrupt_after_ms: float = 1000.0, limit_s: float = 60.0) -> ReplyHeard:
        """The agent says ``audio``; with ``interruption`` (48 kHz, its first sample its onset) the
        caller says it ``interrupt_after_ms`` into the reply."""
        path = self.path
        before = (path.pauses, path.false_pauses, path.pauses_withheld)
        rid = self.conversation.reply(audio, rate)
        while path.playout.current_response_id != rid and not self.conversation.cancelled(rid):
            await asyncio.sleep(0)  # the call path takes the events in
        sent_before = len(self.conversation.sent)
        onset_step: int | None = None
        quiet_step: int | None = None
        steps = 0
        after = 0
        while after < RING_OUT_FRAMES and steps < limit_s * 1000 / FRAME_MS:
            if interruption is not None and onset_step is None and steps * FRAME_MS >= interrupt_after_ms:
                self.microphone.say(interruption)
                onset_step = steps
            out = self.step()
            if onset_step is not None and quiet_step is None and int(np.abs(out).max()) < QUIET:
                quiet_step = steps
            steps += 1
            playing = path.playout.playing or path.playout.paused or self.microphone.busy
            after = 0 if playing else after + 1
            await asyncio.sleep(0)
        heard = ReplyHeard(self.conversation.cancelled(rid), path.playout.played_ms(rid), path.pauses - before[0], path.false_pauses - before[1],
                           path.pauses_withheld - before[2])
        if interruption is not None and onset_step is not None:
            if quiet_step is not None and heard.cancelled:
                heard.onset_to_quiet_ms = (quiet_step - onset_step) * FRAME_MS
            heard.kept_db = _kept_db(interruption, self.conversation.heard_since(sent_before),
                                     skip_ms=interrupt_after_ms)
        return heard


def _kept_db(said: np.ndarray, given16k: np.ndarray, *, skip_ms: float) -> float | None:
    """The first half second of the interruption as the model got it, in dB over what was said
    (echo cancelling that swallows the caller's words shows here as a large loss)."""
    start = int(16 * skip_ms)
    given = given16k[start:start + 8000]
    said16 = said[::3][:8000]
    if given.size < said16.size or not said16.any():
        return None
    return float(10 * np.log10((np.mean(given**2) + 1e-12) / (np.mean(said16**2) + 1e-12)))

