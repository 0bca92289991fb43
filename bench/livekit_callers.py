"""Callers that keep barging in, in a process of their own, over LiveKit or direct WebRTC.

Used by ``bench.livekit_path`` so that the callers' CPU (Opus, SRTP, ICE, the
SDK's media threads) is not counted against the worker. Each caller runs the
same loop until told to stop:

1. say a Piper question;
2. wait until it has heard ~300 ms of the agent's reply;
3. say a short interruption (the agent should stop at once: an edge barge-in) that runs
   straight on into the next question, as one user turn; once it is said and the cut reply's
   last audio has been heard (a short quiet), back to 2.

Not waiting for a separate answer to the interruption halves each trial (~3 s instead of ~6 s),
so a run gets its barge-in trials while the machine still has cores to spare.

``--transport livekit``: N rooms on a LiveKit server (real ``livekit`` SDK), one
caller each, its token naming ``--agent-name`` in the room configuration, so
joining the room dispatches the agent to it.
``--transport direct``: N aiortc peers against a worker's ``POST /api/offer``.

stdout is JSON lines: ``{"event": "ready"}`` once every caller hears the agent's
track, ``{"event": "progress", ...}`` after each interruption, and finally
``{"event": "done", "callers": [...]}`` with per-caller figures. Runs for
``--seconds`` or until its stdin closes, whichever comes first (``--until-heard``: or
until every caller has heard the agent).

Run: python -m bench.livekit_callers --transport livekit --url ws://HOST:PORT --api-key K \
         --api-secret S --agent-name bench-agent --sessions 2
     python -m bench.livekit_callers --transport direct --url http://127.0.0.1:PORT --sessions 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable

import numpy as np

from bench.webrtc_callers import stop_on_stdin_close

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960
QUESTIONS = (
    "What time is it?",
    "Where is the station?",
    "Can you help me?",
    "Is it raining today?",
)
INTERRUPTIONS = (
    "Wait, stop.",
    "Hold on.",
    "Sorry, one thing.",
    "No, stop please.",
)
#: The agent's audio counts as heard above this RMS (-34 dBFS); quiet below QUIET_RMS.
LOUD_RMS = 0.02
QUIET_RMS = 0.01
#: Where the caller's own sound starts: the first 5 ms block over -40 dBFS.
ONSET_RMS = 0.01
HEAR_BEFORE_INTERRUPTING_MS = 300.0
#: The next reply starts after the caller's turn and the worker's end-of-turn silence (500 ms); audio heard
#: before a quiet this long is the cut reply's tail, still on its way (seconds of it on a starved machine).
NEXT_REPLY_QUIET_MS = 300.0
#: Silence before a question said on its own; between an interruption's last sound and the next question.
QUESTION_LEAD_MS = 200.0
INTERRUPTION_GAP_MS = 100.0
#: The scripted reply is 1000 ms of tone (``--reply-ms``); heard all but this much of it, it was not cut short.
REPLY_MS = 1000.0
PLAYED_OUT_MARGIN_MS = 100.0
#: The LiveKit caller's AudioSource queue: short, so a frame goes out soon after it is made.
MIC_QUEUE_MS = 40


def acoustic_onset(samples: np.ndarray, rate: int = SAMPLE_RATE) -> int:
    block = rate // 200
    for start in range(0, samples.size - block, block):
        if float(np.sqrt(np.mean(samples[start : start + block] ** 2))) > ONSET_RMS:
            return start
    return 0


def acoustic_end(samples: np.ndarray, rate: int = SAMPLE_RATE) -> int:
    """Index just past the last 5 ms block over ONSET_RMS."""
    block = rate // 200
    end = 0
    for start in range(0, samples.size - block, block):
        if float(np.sqrt(np.mean(samples[start : start + block] ** 2))) > ONSET_RMS:
            end = start + block
    return end


class Mic:
    """Queued caller speech, one 20 ms int16 frame at a time; notes when an utterance's onset and end went out."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, np.float32)
        self._onset_in: int | None = None
        self._end_in: int | None = None
        self.onset_sent_at: float | None = None
        self.end_sent_at: float | None = None

    @property
    def busy(self) -> bool:
        return self._pending.size > 0

    def say(self, audio: np.ndarray) -> None:
        self._onset_in = self._pending.size + acoustic_onset(audio)
        self._end_in = self._pending.size + acoustic_end(audio)
        self.onset_sent_at = self.end_sent_at = None
        self._pending = np.concatenate([self._pending, audio.astype(np.float32)])

    def next_frame(self) -> np.ndarray:
        chunk, self._pending = self._pending[:FRAME_SAMPLES], self._pending[FRAME_SAMPLES:]
        frame = np.zeros(FRAME_SAMPLES, np.int16)
        frame[: chunk.size] = (np.clip(chunk, -1.0, 1.0) * 32767).astype(np.int16)
        now = time.perf_counter()
        if self._onset_in is not None:
            if self._onset_in < FRAME_SAMPLES:
                self._onset_in = None
                self.onset_sent_at = now
            else:
                self._onset_in -= FRAME_SAMPLES
        if self._end_in is not None:
            if self._end_in < FRAME_SAMPLES:
                self._end_in = None
                self.end_sent_at = now
            else:
                self._end_in -= FRAME_SAMPLES
        return frame


def quiet_tail_ms(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    """How long the end of ``samples`` is quiet, in whole 5 ms blocks under QUIET_RMS."""
    block = rate // 200
    audio = samples.astype(np.float32)
    quiet = 0
    for end in range(audio.size, block - 1, -block):
        if float(np.sqrt(np.mean(audio[end - block : end] ** 2))) >= QUIET_RMS:
            break
        quiet += 1
    return 1000.0 * quiet * block / rate


class Ear:
    """The agent's audio as the caller receives it: loud time heard, the current quiet run."""

    def __init__(self) -> None:
        self.frames = 0
        self.received_ms = 0.0
        self.loud_ms = 0.0
        self.quiet_run_ms = 0.0
        self.quiet_since: float | None = None
        self.loud_since: float | None = None  # when the current run of loud frames began
        self.first_at: float | None = None

    def hear(self, samples: np.ndarray) -> None:
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        ms = 1000.0 * samples.size / SAMPLE_RATE
        self.frames += 1
        self.received_ms += ms
        rms = float(np.sqrt(np.mean(samples.astype(np.float32) ** 2))) if samples.size else 0.0
        if rms > LOUD_RMS:
            if self.loud_since is None:
                self.loud_since = now
            self.loud_ms += ms
        else:
            self.loud_since = None
        if rms < QUIET_RMS:
            if self.quiet_run_ms == 0.0:
                self.quiet_since = now
            self.quiet_run_ms += ms
        else:
            # A frame that goes quiet within it (a 5 ms fade-out, then silence) is quiet from there:
            # counted from the next frame, a stop would be heard up to a frame late.
            tail_ms = quiet_tail_ms(samples)
            self.quiet_run_ms = tail_ms
            self.quiet_since = now + (ms - tail_ms) / 1000.0 if tail_ms else None


async def until(condition: Callable[[], bool], timeout: float, stop: asyncio.Event) -> bool:
    """Poll ``condition`` every 5 ms; False on timeout or when ``stop`` is set."""
    deadline = time.perf_counter() + timeout
    while not condition():
        if stop.is_set() or time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


class Caller:
    """One caller's trial loop; a transport subclass connects it and moves the audio."""

    def __init__(self, index: int, speech: dict[str, np.ndarray]) -> None:
        self.index = index
        self.speech = speech
        self.mic = Mic()
        self.ear = Ear()
        self.error: str | None = None
        self.connected_s: float | None = None
        self.attempts = 0
        self.no_reply = 0
        #: Interruption's onset handed to the transport -> the agent's audio went quiet at the caller
        #: (only where the reply was cut short, not where it had played out).
        self.heard_stop_ms: list[float] = []
        self.played_out = 0  # interruptions after which the reply still played to its end
        #: Interruptions after which the caller heard no stop within 3 s, nor the reply play out: their onsets,
        #: and how much of the reply had been heard by then (the summary adds when the worker said it cut
        #: the reply, before the next interruption).
        self._missed: list[tuple[float, float]] = []
        self._onsets: list[float] = []  # each interruption's onset, this process's clock
        #: The question's end handed to the transport -> the reply's first loud frame heard
        #: (the worker's 500 ms end-of-turn silence included).
        self.reply_after_ms: list[float] = []
        #: Wall-clock time (time.time()) each interruption's onset was handed to the transport.
        self.onsets_wall: list[float] = []
        self.figures: dict[str, object] = {}  # the worker's own call figures, where the transport carries them
        self.reply_ms = REPLY_MS  # the worker's reply, as long as it plays when nobody talks over it
        #: How the call ended before this caller hung up (a connection state; None: it did not), where the
        #: transport tells.
        self.dropped: str | None = None
        #: The text of each turn said whose reply was awaited (heard, or given up on), in order.
        self.said: list[str] = []
        #: What the worker heard this caller say: its user transcripts (LiveKit only).
        self.heard: list[str] = []
        #: Connections dropped and resumed mid-call (direct only), and the seconds each resume took.
        self.resumes = 0
        self.resume_s: list[float] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return self.ear.frames > 0

    async def connect(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _question(self, turn: int) -> tuple[str, np.ndarray]:
        question = QUESTIONS[(self.index + turn) % len(QUESTIONS)]
        lead = np.zeros(int(SAMPLE_RATE * QUESTION_LEAD_MS / 1000), np.float32)
        return question, np.concatenate([lead, self.speech[question]])

    def _interruption_then_question(self, turn: int) -> tuple[str, np.ndarray]:
        """The interruption running on into the next question: one user turn (the gap is well under the
        worker's 500 ms end-of-turn silence), so the next reply comes to the question."""
        said = INTERRUPTIONS[(self.index + turn) % len(INTERRUPTIONS)]
        question = QUESTIONS[(self.index + turn) % len(QUESTIONS)]
        interruption = self.speech[said]
        interruption = interruption[: acoustic_end(interruption) + int(SAMPLE_RATE * INTERRUPTION_GAP_MS / 1000)]
        return f"{said} {question}", np.concatenate([interruption, self.speech[question]])

    def _say(self, turn: tuple[str, np.ndarray]) -> str:
        self.mic.say(turn[1])
        return turn[0]

    async def converse(self, stop: asyncio.Event, report: Callable[[], None]) -> None:
        """Question; ~300 ms of the reply heard; interruption + next question; ~300 ms of that reply; ..."""
        turn = 0
        reply_from = self.ear.loud_ms  # loud agent audio heard before the reply now awaited
        text = self._say(self._question(turn))
        while not stop.is_set():
            replied = await until(lambda h=reply_from: self.ear.loud_ms - h >= HEAR_BEFORE_INTERRUPTING_MS, 12.0, stop)
            if stop.is_set():
                return
            self.said.append(text)
            if not replied:
                self.no_reply += 1
                await until(lambda: self.ear.quiet_run_ms >= 600 and not self.mic.busy, 10.0, stop)
                turn += 1
                reply_from = self.ear.loud_ms
                text = self._say(self._question(turn))
                continue
            ended, began = self.mic.end_sent_at, self.ear.loud_since
            if ended is not None and began is not None and began > ended:
                self.reply_after_ms.append(1000.0 * (began - ended))
            await self.between_turns()
            if self.error is not None:
                return
            turn += 1
            text = self._say(self._interruption_then_question(turn))
            self.attempts += 1
            await until(lambda: self.mic.onset_sent_at is not None, 2.0, stop)
            onset = self.mic.onset_sent_at
            if onset is not None:
                self._onsets.append(onset)
                self.onsets_wall.append(time.time() - (time.perf_counter() - onset))
            if onset is not None and await until(
                    lambda o=onset: self.ear.quiet_since is not None and self.ear.quiet_since >= o
                    and self.ear.quiet_run_ms >= 100, 3.0, stop):
                assert self.ear.quiet_since is not None
                # Near all of the reply heard means it played out: the barge-in missed it.
                if self.ear.loud_ms - reply_from < self.reply_ms - PLAYED_OUT_MARGIN_MS:
                    self.heard_stop_ms.append(1000.0 * (self.ear.quiet_since - onset))
                else:
                    self.played_out += 1
            elif onset is not None and not stop.is_set():
                self._missed.append((onset, self.ear.loud_ms - reply_from))
            report()
            await until(lambda: not self.mic.busy and self.ear.quiet_run_ms >= NEXT_REPLY_QUIET_MS, 10.0, stop)
            reply_from = self.ear.loud_ms

    def cut_after(self, onset: float, before: float) -> float | None:
        """When the worker said it cut a reply between ``onset`` and ``before`` (ms after the onset), where the
        transport tells."""
        return None

    def _misses(self) -> list[dict[str, float | None]]:
        """Each missed interruption: the reply heard by the end of its 3 s, and when the worker said it cut
        the reply (ms after the onset; None: not before the next interruption, or the transport does not tell)."""
        found = []
        for onset, heard_ms in self._missed:
            later = [o for o in self._onsets if o > onset]
            found.append({"heard_ms": round(heard_ms), "cut_ms": self.cut_after(onset, min(later, default=float("inf")))})
        return found

    async def between_turns(self) -> None:
        """Called once a reply has been heard, before talking over it: a transport may drop and come back here."""

    def summary(self) -> dict[str, object]:
        return {
            "index": self.index,
            "error": self.error,
            "connected_s": None if self.connected_s is None else round(self.connected_s, 3),
            "frames": self.ear.frames,
            "received_ms": round(self.ear.received_ms),
            "loud_ms": round(self.ear.loud_ms),
            "attempts": self.attempts,
            "no_reply": self.no_reply,
            "heard_stop_ms": [round(v, 1) for v in self.heard_stop_ms],
            "played_out": self.played_out,
            "missed": self._misses(),
            "reply_after_ms": [round(v, 1) for v in self.reply_after_ms],
            "onsets_wall": [round(v, 4) for v in self.onsets_wall],
            "dropped": self.dropped,
            "worker_figures": self.figures,
            "said": self.said,
            "heard": self.heard,
            "resumes": self.resumes,
            "resume_s": [round(v, 3) for v in self.resume_s],
        }


# ---------------------------------------------------------------- LiveKit (real SDK)


def room_token(api_key: str, api_secret: str, room: str, identity: str, agent_name: str, metadata: str = "") -> str:
    """A token that joins ``room`` as ``identity`` and dispatches ``agent_name`` to it, with the job's
    ``metadata`` (default: the caller's identity, as the worker reads it)."""
    from livekit import api

    grants = api.VideoGrants(room_join=True, room=room, can_publish=True, can_subscribe=True, can_publish_data=True)
    dispatch = api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=agent_name,
                                                                   metadata=metadata or json.dumps({"caller": identity}))])
    token = (api.AccessToken(api_key, api_secret).with_identity(identity).with_name(identity)
             .with_grants(grants).with_room_config(dispatch))
    with warnings.catch_warnings():  # short bench secrets make PyJWT warn
        warnings.simplefilter("ignore")
        return token.to_jwt()


class LiveKitCaller(Caller):
    """A caller on the real livekit SDK. Its audio and room events reach it as the worker's do
    (``webrtc.livekit.ffi_router``): with the SDK's stock stream, source and room, N callers in
    this one process wake N x N times per frame, and at 16 calls they took more of this 2-core
    machine than the worker under test. What the worker receives is the same."""

    def __init__(self, index: int, speech: dict[str, np.ndarray], url: str, token: str) -> None:
        super().__init__(index, speech)
        from livekit import rtc

        from duplex_agent.webrtc.livekit.ffi_audio import AgentVoiceSource

        self._rtc = rtc
        self.url = url
        self.token = token
        self.room = rtc.Room()
        self.source = AgentVoiceSource(SAMPLE_RATE, 1, queue_size_ms=MIC_QUEUE_MS)
        self.room.on("track_subscribed", self._on_track)
        self.room.register_text_stream_handler("lk.transcription", self._on_transcript)

    def _on_transcript(self, reader, sender: str) -> None:
        """Keeps the worker's transcripts of this caller's own speech (sent in the caller's name)."""
        if sender != self.room.local_participant.identity:
            return

        async def read() -> None:
            with contextlib.suppress(self._rtc.StreamError):  # the caller left mid-stream
                self.heard.append(await reader.read_all())

        self._tasks.append(asyncio.create_task(read(), name=f"caller-{self.index}-transcript"))

    def _on_track(self, track, publication, participant) -> None:
        if track.kind == self._rtc.TrackKind.KIND_AUDIO:
            self._tasks.append(asyncio.create_task(self._listen(track), name=f"caller-{self.index}-listen"))

    async def _listen(self, track) -> None:
        from duplex_agent.webrtc.livekit.ffi_audio import CallerAudioStream

        stream = CallerAudioStream(track, SAMPLE_RATE, frame_size_ms=10)  # the ear's 10 ms resolution
        try:
            async for frame in stream:
                self.ear.hear(np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768.0)
        finally:
            await stream.aclose()

    async def _feed(self) -> None:
        rtc = self._rtc
        while True:
            frame = self.mic.next_frame()
            await self.source.capture_frame(rtc.AudioFrame(frame.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES))

    async def connect(self) -> None:
        from duplex_agent.webrtc.livekit.ffi_router import FfiRouter

        rtc = self._rtc
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self.room.connect(self.url, self.token), 20)
            FfiRouter.shared().own_room(self.room)
            track = rtc.LocalAudioTrack.create_audio_track("mic", self.source.source)
            await self.room.local_participant.publish_track(
                track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
            self._tasks.append(asyncio.create_task(self._feed(), name=f"caller-{self.index}-feed"))
            self.connected_s = time.perf_counter() - started
        except Exception as exc:  # report, do not crash the other callers
            self.error = repr(exc)

    async def close(self) -> None:
        await super().close()
        try:
            await asyncio.wait_for(self.room.disconnect(), 10)
        except Exception as exc:
            self.error = self.error or f"disconnect: {exc!r}"


# ---------------------------------------------------------------- direct WebRTC (aiortc)


class DirectCaller(Caller):
    """An aiortc caller. With ``resume_after_s``, its connection drops once that far into the call (at
    the next turn) and it comes back with its resume token on a new one, as a page does after a
    network change: the conversation must carry on where it was. With ``busy_retry_s``, a worker that
    refuses it as busy is asked again when it says, for that long."""

    def __init__(self, index: int, speech: dict[str, np.ndarray], url: str, address: str,
                 resume_after_s: float = 0.0, busy_retry_s: float = 0.0) -> None:
        super().__init__(index, speech)
        self.url = url
        self.address = address
        self._hanging_up = False  # a drop the caller makes itself (hang-up, resume) is no dropped call
        self.peer = self._new_peer()
        self.resume_after_s = resume_after_s
        self.busy_retry_s = busy_retry_s
        self.busy_refusals = 0
        self._started = time.perf_counter()
        self._resume: dict[str, object] = {}  # the last answer's pc_id and resume_token

    def _new_peer(self):
        from devtools.caller_peer import CallerPeer
        from duplex_agent.webrtc.direct.tracks import PlayoutTrack

        peer = CallerPeer(PlayoutTrack(self.mic.next_frame), on_frame=self.ear.hear)
        peer.pc.on("connectionstatechange", self._state_changed)
        return peer

    def _state_changed(self) -> None:
        state = self.peer.pc.connectionState
        if state in ("failed", "closed") and not self._hanging_up and self.dropped is None:
            self.dropped = state

    def cut_after(self, onset: float, before: float) -> float | None:
        for at, event in self.peer.events:
            if onset <= at < before and (event.get("type") == "output_audio_buffer.cleared" or (
                    event.get("type") == "response.done" and event.get("status") == "cancelled")):
                return round(1000.0 * (at - onset), 1)
        return None

    async def _offer(self, extra: dict[str, object]) -> float:
        import aiohttp

        from bench.webrtc_callers import offer_and_answer

        async with aiohttp.ClientSession() as http:
            seconds, answer = await offer_and_answer(self.peer.pc, self.address, http, self.url,
                                                     {"resumable": True, **extra} if self.resume_after_s else {})
        self._resume = {"pc_id": answer.get("pc_id"), "resume_token": answer.get("resume_token")}
        return seconds

    async def connect(self) -> None:
        from bench.webrtc_callers import ConnectFailed

        self._started = time.perf_counter()
        while True:
            try:
                self.connected_s = await self._offer({})
                return
            except ConnectFailed as exc:
                # A busy worker says when to ask again; a patient caller does, for busy_retry_s.
                if exc.retry_after_s is None or time.perf_counter() - self._started + exc.retry_after_s > self.busy_retry_s:
                    self.error = str(exc)
                    return
                self.busy_refusals += 1
                await asyncio.sleep(exc.retry_after_s)
            except Exception as exc:  # report, do not crash the other callers
                self.error = repr(exc)
                return

    def summary(self) -> dict[str, object]:
        return {**super().summary(), "busy_refusals": self.busy_refusals}

    async def _hang_up(self) -> None:
        import aiohttp

        try:
            async with aiohttp.ClientSession() as http, http.delete(
                    self.url + "/api/offer", json={"pc_id": self._resume["pc_id"]},
                    timeout=aiohttp.ClientTimeout(total=10)) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.error = self.error or f"hang-up: {exc!r}"

    async def between_turns(self) -> None:
        if not self.resume_after_s or self.resumes or time.perf_counter() - self._started < self.resume_after_s:
            return
        from bench.webrtc_callers import ConnectFailed

        self._hanging_up = True
        await self.peer.close()  # the connection goes, as on a network change; no hang-up is sent
        self.peer = self._new_peer()
        self._hanging_up = False
        try:
            self.resume_s.append(await self._offer({"resume": self._resume}))
            self.resumes += 1
        except Exception as exc:
            self.error = f"resume failed: {exc}" if isinstance(exc, ConnectFailed) else f"resume failed: {exc!r}"

    async def close(self) -> None:
        self._hanging_up = True
        if self.peer.channel.readyState == "open":  # the worker's figures of the call as it ends, not 5 s before
            mark = len(self.peer.events)
            self.peer.send({"type": "metrics.request"})
            await self.peer.until(lambda: self.peer.events_since(mark, "metrics"), 5.0)
        if self.resume_after_s and self._resume.get("pc_id"):
            await self._hang_up()  # a resumable conversation would be kept for a resume after the hang-up
        await self.peer.close()
        await super().close()
        reported = self.peer.events_since(0, "metrics")  # the worker's call figures, the latest
        if reported:
            self.figures = {k: reported[-1].get(k) for k in ("barge_ins", "underruns")}


# ---------------------------------------------------------------- the run


def _emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def load_speech(path: str = "") -> dict[str, np.ndarray]:
    """Piper saying every question (with 200 ms of silence first) and interruption, by text.

    ``path``: an .npz written beforehand with q0.. (questions) and i0.. (interruptions).
    """
    if path:
        with np.load(path) as stored:
            speech = {text: stored[f"q{i}"].astype(np.float32) for i, text in enumerate(QUESTIONS)}
            speech.update({text: stored[f"i{i}"].astype(np.float32) for i, text in enumerate(INTERRUPTIONS)})
        return speech
    from devtools.speech import speak

    speech = {text: speak(text, SAMPLE_RATE) for text in QUESTIONS}
    speech.update({text: speak(text, SAMPLE_RATE) for text in INTERRUPTIONS})
    return speech


def make_callers(args: argparse.Namespace, speech: dict[str, np.ndarray]) -> list[Caller]:
    callers = _transport_callers(args, speech)
    for caller in callers:
        caller.reply_ms = args.reply_ms
    return callers


def _transport_callers(args: argparse.Namespace, speech: dict[str, np.ndarray]) -> list[Caller]:
    if args.transport == "livekit":
        tag = args.room_prefix or f"bench-{uuid.uuid4().hex[:6]}"
        callers: list[Caller] = []
        for i in range(args.sessions):
            identity = f"caller-{i}"
            token = room_token(args.api_key, args.api_secret, f"{tag}-{i}", identity, args.agent_name,
                               args.dispatch_metadata)
            callers.append(LiveKitCaller(i, speech, args.url, token))
        return callers
    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    address = args.ice_address or interface_ipv4()
    return [DirectCaller(i, speech, args.url.rstrip("/"), address, args.resume_after, args.busy_retry)
            for i in range(args.sessions)]


async def run(args: argparse.Namespace) -> dict[str, object]:
    speech = await asyncio.to_thread(load_speech, args.speech)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if not args.ignore_stdin:
        stop_on_stdin_close(loop, stop)
    loop.call_later(args.seconds, stop.set)
    started = time.perf_counter()
    cpu_started = time.process_time()
    callers = make_callers(args, speech)
    if args.transport == "livekit":
        # One room at a time, each once its agent is there: livekit-agents, with no idle processes
        # configured, counts a job it has accepted but not yet started as a whole worker's load, so
        # it turns down a second dispatch that arrives meanwhile (see the report of bench.livekit_path).
        for caller in callers:
            await caller.connect()
            if caller.error is None:
                await until(lambda c=caller: c.ready, 20.0, stop)
    else:
        await asyncio.gather(*(c.connect() for c in callers))
    connected = [c for c in callers if c.error is None]
    all_ready = await until(lambda: all(c.ready for c in connected), 40.0, stop)
    _emit({"event": "ready" if all_ready and len(connected) == len(callers) else "not_ready",
           "connected": len(connected), "hearing": sum(c.ready for c in connected),
           "elapsed_s": round(time.perf_counter() - started, 3)})

    def report() -> None:
        _emit({"event": "progress", "attempts": sum(c.attempts for c in callers)})

    talks = [asyncio.create_task(c.converse(stop, report), name=f"caller-{c.index}") for c in connected if c.ready]
    if args.until_heard:
        await until(lambda: all(c.ear.loud_ms >= HEAR_BEFORE_INTERRUPTING_MS for c in callers), args.seconds, stop)
        stop.set()
    await stop.wait()
    await asyncio.gather(*talks, return_exceptions=True)
    cpu = time.process_time() - cpu_started
    wall = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    return {"event": "done", "callers": [c.summary() for c in callers], "wall_s": round(wall, 2),
            "callers_cpu_cores": round(cpu / wall, 3) if wall > 0 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("livekit", "direct"), required=True)
    parser.add_argument("--url", required=True, help="ws://HOST:PORT of the LiveKit server, or http://HOST:PORT of a worker")
    parser.add_argument("--sessions", type=int, default=1, help="callers (LiveKit: one room each)")
    parser.add_argument("--api-key", default=os.environ.get("LIVEKIT_API_KEY", ""))
    parser.add_argument("--api-secret", default=os.environ.get("LIVEKIT_API_SECRET", ""))
    parser.add_argument("--agent-name", default="bench-agent")
    parser.add_argument("--dispatch-metadata", default="", help="the dispatched job's metadata (default: the caller's "
                        "identity); a LiveKit Agents app may read its mode there")
    parser.add_argument("--room-prefix", default="", help="LiveKit rooms are PREFIX-0, PREFIX-1, ...")
    parser.add_argument("--ice-address", default="", help="direct: local address for ICE (default: this machine's interface)")
    parser.add_argument("--speech", default="", help=".npz of the phrases at 48 kHz (default: Piper says them now)")
    parser.add_argument("--seconds", type=float, default=60.0, help="most seconds to run")
    parser.add_argument("--reply-ms", type=float, default=REPLY_MS,
                        help="how long the worker's reply plays when nobody talks over it (the scripted model's: 1000)")
    parser.add_argument("--until-heard", action="store_true",
                        help="stop once every caller has heard the agent (or at --seconds)")
    parser.add_argument("--resume-after", type=float, default=0.0, metavar="S",
                        help="direct: drop the connection once, S seconds into the call, and resume with the token")
    parser.add_argument("--busy-retry", type=float, default=0.0, metavar="S",
                        help="direct: a caller refused as busy (503 with Retry-After) asks again, for up to S seconds")
    parser.add_argument("--ignore-stdin", action="store_true", help="run for --seconds even if stdin closes")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _emit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
