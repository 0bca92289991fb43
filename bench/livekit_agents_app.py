"""The worker the barge-in bench dispatches to: one LiveKit Agents app, three ways per job.

The job's metadata picks the way: ``ours`` (``AgentSession(llm=DuplexModel(url))``), ``naive``
(LiveKit's adapter around a naive DuplexModel on the same backend: it plays the model's audio at
real time and passes its text on as it comes, as a plugin written to the bare interface would) or
``echo`` (no model: the caller's audio straight back, the transport's floor). History items go to
the JSON lines file BENCH_RECORD. Run by ``bench.livekit_agents_bargein``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import numpy as np
from livekit import agents, rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobExecutorType, llm
from livekit.agents.llm.duplex import DuplexAudioFrame, DuplexOutputTranscriptDelta

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import StreamingResampler
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.remote.conversation import RemoteOptions
from duplex_agent.livekit_agents import DuplexModel

AGENT_NAME = "duplex-bargein-bench"
URL = os.environ["BENCH_BACKEND_URL"]
RECORD = os.environ["BENCH_RECORD"]
OPTIONS = RemoteOptions(stall_timeout_s=20.0)  # the reference model on a loaded CPU
CAPS = llm.DuplexCapabilities(user_transcription=True, auto_tool_reply_generation=False)


class NaiveDuplexModel(llm.DuplexModel):
    def __init__(self) -> None:
        super().__init__(capabilities=CAPS)
        self.backend = RemoteBackend(URL, max_sessions=64, options=OPTIONS)

    def session(self) -> NaiveDuplexSession:
        return NaiveDuplexSession(self)

    async def aclose(self) -> None:
        pass


class NaiveDuplexSession(llm.DuplexSession):
    """Audio in at the model's rate, audio out at real time, text on as it arrives: nothing more."""

    def __init__(self, model: NaiveDuplexModel) -> None:
        super().__init__(model)
        self._model = model
        self._conversation = None
        self._input: StreamingResampler | None = None
        self._output: dict[str, StreamingResampler] = {}
        self._queued = np.zeros(0, np.float32)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        await self._configured.wait()
        self._conversation = conversation = await self._model.backend.open()
        rate = conversation.capabilities.input_sample_rate
        conversation.send(p.SessionUpdate(session={"input_audio_format": "pcm_f32le", "input_sample_rate": rate,
                                                   "turn_detection": {"type": "server_vad"}}))
        async for event in conversation.events():
            if isinstance(event, p.ResponseAudioDelta):
                resampler = self._output.setdefault(event.response_id, StreamingResampler(event.sample_rate, 48000))
                self._queued = np.concatenate([self._queued, resampler.process(event.audio)])
            elif isinstance(event, p.ResponseTranscriptDelta):
                self.emit("transcript_delta", DuplexOutputTranscriptDelta(text=event.delta))
            elif isinstance(event, p.SpeechStarted):
                self.emit("input_speech_started", llm.InputSpeechStartedEvent())

    @property
    async def audio_stream(self):
        loop = asyncio.get_running_loop()
        origin, tick = loop.time(), 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, origin + tick * 0.02 - loop.time()))
            chunk, self._queued = self._queued[:960], self._queued[960:]
            pcm = np.zeros(960, np.int16)
            pcm[: chunk.size] = (np.clip(chunk, -1, 1) * 32767).astype(np.int16)
            yield DuplexAudioFrame(rtc.AudioFrame(pcm.tobytes(), 48000, 1, 960))

    @property
    def tools(self) -> llm.ToolContext:
        return llm.ToolContext.empty()

    def push_audio(self, frame: rtc.AudioFrame) -> None:
        if self._conversation is None:
            return
        if self._input is None or self._input.in_rate != frame.sample_rate:  # the room input's rate (24 kHz)
            self._input = StreamingResampler(frame.sample_rate, self._conversation.capabilities.input_sample_rate)
        samples = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768.0
        audio = self._input.process(samples)
        if audio.size:
            self._conversation.send(p.InputAudioBufferAppend(audio=audio, sample_rate_hz=self._input.out_rate))

    async def _update_instructions(self, instructions: str) -> None:
        pass

    async def _append_items(self, items) -> None:
        pass

    async def _update_tools(self, tools) -> None:
        pass

    def _update_options(self, *, tool_choice=None) -> None:
        pass

    async def aclose(self) -> None:
        await super().aclose()
        self._task.cancel()
        if self._conversation is not None:
            await self._conversation.close()


OURS = DuplexModel(URL, options=OPTIONS)
NAIVE = NaiveDuplexModel()
server = AgentServer(job_executor_type=JobExecutorType.THREAD, port=0, drain_timeout=10, load_fnc=lambda: 0.0)


def _record(room: str, **data) -> None:
    with open(RECORD, "a") as f:
        f.write(json.dumps({"room": room, "at": time.time(), **data}) + "\n")


async def _echo(ctx: agents.JobContext) -> None:
    source = rtc.AudioSource(48000, 1, queue_size_ms=60)
    await ctx.room.local_participant.publish_track(rtc.LocalAudioTrack.create_audio_track("echo", source))
    done = asyncio.Event()
    ctx.room.on("disconnected", lambda *_: done.set())

    async def echo(track: rtc.Track) -> None:
        echoing = False
        async for event in rtc.AudioStream(track, sample_rate=48000, num_channels=1):
            await source.capture_frame(event.frame)
            if not echoing:  # the caller's audio comes through: the bench may mark its onset now
                echoing = True
                _record(ctx.room.name, kind="echoing")

    ctx.room.on("track_subscribed", lambda track, *_: asyncio.ensure_future(echo(track)))
    _record(ctx.room.name, kind="started")
    await done.wait()


@server.rtc_session(agent_name=AGENT_NAME)
async def entrypoint(ctx: agents.JobContext) -> None:
    mode, room = ctx.job.metadata, ctx.room.name
    if mode == "echo":
        await ctx.connect()
        await _echo(ctx)
        return
    session = AgentSession(llm=OURS if mode == "ours" else NAIVE, aec_warmup_duration=None)
    loop = asyncio.get_running_loop()

    def item_added(ev) -> None:
        item = ev.item
        if getattr(item, "type", "") == "message":
            loop.call_soon(lambda: _record(room, kind="item", role=item.role, text=item.text_content or "",
                                           interrupted=item.interrupted))

    session.on("conversation_item_added", item_added)
    session.on("close", lambda ev: ctx.shutdown("closed"))
    await session.start(room=ctx.room, agent=Agent(instructions="Repeat what the caller says."))
    _record(room, kind="started")


if __name__ == "__main__":
    agents.cli.run_app(server)
