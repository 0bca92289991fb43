"""The LiveKit barge-in floor: a bare ``livekit.rtc`` agent that answers with a tone and stops on the caller's energy.

Registered with the LiveKit server as a worker (livekit-agents as shipped: a process per
job, so no job's SDK wakes for another's events), it
joins each room it is dispatched to and does what the scripted worker does, with the
least reaction a LiveKit agent can have: once the caller has been quiet for
``END_OF_TURN_MS`` after speaking, it plays ``REPLY_MS`` of tone; the first 10 ms frame
of the caller's over ``ONSET_RMS`` stops it at once (its source's queue cleared). No
VAD, no model, no resampling: what is left of barge-in is the SDK's receive and send
paths and the SFU. ``/metrics`` serves the one figure the benches read from it, the
open sessions.

Run: python -m bench.livekit_echo_agent --metrics-port 8092  (LIVEKIT_URL, LIVEKIT_API_KEY,
     LIVEKIT_API_SECRET and DUPLEX_AGENT_NAME from the environment)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os

import numpy as np
from aiohttp import web
from livekit import rtc
from livekit.agents import AgentServer, JobContext, JobExecutorType

RATE = 48000
FRAME = RATE // 100  # 10 ms
#: The caller's speech, as the callers' own onset (-40 dBFS).
ONSET_RMS = 0.01
END_OF_TURN_MS = 500
REPLY_MS = 1000
#: The agent's source queue: as short as the SDK's 10 ms frames allow keeping it fed.
QUEUE_MS = 40


class ToneReplier:
    """One call: hears the caller, says a tone after each of its turns, stops when it speaks."""

    def __init__(self) -> None:
        self.source = rtc.AudioSource(RATE, 1, queue_size_ms=QUEUE_MS)
        self._reply_left = 0  # samples of tone still to say
        self._phase = 0
        self._spoke = False
        self._quiet_ms = 0
        self.listening = False

    def hear(self, frame: np.ndarray) -> None:
        if float(np.sqrt(np.mean(frame * frame))) > ONSET_RMS:
            self._spoke, self._quiet_ms = True, 0
            if self._reply_left:
                self._reply_left = 0
                self.source.clear_queue()
        else:
            self._quiet_ms += 1000 * frame.size // RATE
            if self._spoke and self._quiet_ms >= END_OF_TURN_MS:
                self._spoke, self._reply_left = False, RATE * REPLY_MS // 1000

    def next_frame(self) -> rtc.AudioFrame:
        pcm = np.zeros(FRAME, np.int16)
        if self._reply_left:
            t = np.arange(self._phase, self._phase + FRAME)
            pcm = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t / RATE)).astype(np.int16)
            self._phase += FRAME
            self._reply_left = max(0, self._reply_left - FRAME)
        return rtc.AudioFrame(pcm.tobytes(), RATE, 1, FRAME)

    async def speak(self) -> None:
        while True:
            await self.source.capture_frame(self.next_frame())

    async def listen(self, track: rtc.Track) -> None:
        stream = rtc.AudioStream(track, sample_rate=RATE, num_channels=1, frame_size_ms=10)
        try:
            async for event in stream:
                self.hear(np.frombuffer(event.frame.data, np.int16).astype(np.float32) / 32768.0)
        finally:
            await stream.aclose()


async def entrypoint(ctx: JobContext) -> None:
    replier = ToneReplier()
    tasks: list[asyncio.Task] = []
    done = asyncio.Event()

    def on_track(track: rtc.Track, *_: object) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO and not replier.listening:
            replier.listening = True  # the caller's microphone: one per room
            tasks.append(asyncio.create_task(replier.listen(track)))

    ctx.room.on("track_subscribed", on_track)
    ctx.room.on("disconnected", lambda *_: done.set())
    ctx.room.on("participant_disconnected", lambda *_: done.set())
    await ctx.connect()
    track = rtc.LocalAudioTrack.create_audio_track("agent", replier.source)
    await ctx.room.local_participant.publish_track(
        track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
    tasks.append(asyncio.create_task(replier.speak()))
    try:
        await done.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.shutdown()


async def serve(metrics_port: int, idle: int) -> None:
    server = AgentServer(job_executor_type=JobExecutorType.PROCESS, num_idle_processes=idle, port=0,
                         load_threshold=float("inf"), load_fnc=lambda: 0.0)
    server.rtc_session(entrypoint, agent_name=os.environ.get("DUPLEX_AGENT_NAME", "bench-agent"))

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=f'duplex_sessions_active{{transport="all"}} {len(server.active_jobs)}\n')

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", metrics_port).start()
    print(f"bench livekit echo agent: /metrics on http://127.0.0.1:{metrics_port}", flush=True)
    try:
        await server.run()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--idle", type=int, default=4, help="job processes kept started ahead of dispatch")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("DUPLEX_LOG_LEVEL", "WARNING").upper())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.metrics_port, args.idle))


if __name__ == "__main__":
    main()
