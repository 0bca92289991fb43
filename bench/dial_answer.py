"""Outbound calls: the time from the far end answering to the agent's first sound down its line.

``duplex-agent dial`` with a greeting (the agent speaks first) places each call through the loopback
server's SIP service to a scripted phone that rings for a known time, then answers and waits. The
phone records when it answered and every stretch of audio it heard, so the figure is read on the
phone's side: its first loud 20 ms after the answer, less the answer. What ``dial`` itself costs
before the answer (the dispatch, the worker joining the room, the ringing) is the far end's own
time and is left out; it is printed beside, for context.

The floor is the same figure for a bare agent: a plain livekit.rtc participant in its own room
that places the same call (CreateSIPParticipant, waiting until answered, as the worker does) and
sends a tone the moment the request returns. It learns of the answer the same way and its sound
takes the same room and phone line, so what is beyond it is the worker's own: asking the model to
say the greeting, the model's speech, and the call's playout.

Run: python -m bench.dial_answer [--calls 12] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from livekit import api, rtc
from livekit.protocol import sip as sip_pb

from bench.report import Report
from bench.stats import percentile, summary
from devtools.livekit_server import LoopbackLiveKitServer
from devtools.livekit_server.sip import CallRecord, Phone
from duplex_agent.agent.telephony.dial_request import DialRequest

REPO = Path(__file__).resolve().parent.parent
AGENT_NAME = "duplex-bench-dial"
RING_S = 1.0
GREETING = "Hello, this is the pharmacy calling about your prescription."
#: A frame the phone heard counts as the agent's sound above this peak (its line adds no noise here).
LOUD = 0.02
RATE = 48000


def first_sound_s(call: CallRecord) -> float | None:
    """Seconds from the phone's answer to the first loud frame it heard, or None."""
    if call.answered_at is None:
        return None
    loud = next((h.at for h in call.heard if h.at >= call.answered_at and float(np.abs(h.samples).max()) > LOUD),
                None)
    return None if loud is None else loud - call.answered_at


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def worker_call(server: LoopbackLiveKitServer, trunk: str, number: str) -> tuple[float, float]:
    """The worker dials ``number`` with a greeting: (dispatch to answer, answer to first sound), s."""
    await server.add_phone(number, Phone(rings_for_s=RING_S))
    request = DialRequest(number, trunk, agent_speaks_first=True, greeting=GREETING)
    dialled = time.monotonic()
    await server.create_dispatch(f"dial-{number[-4:]}", AGENT_NAME, request.to_metadata())
    await until(lambda: (c := server.sip_call_to(number)) is not None and first_sound_s(c) is not None, 120,
                f"the agent's first sound on the call to {number}")
    call = server.sip_call_to(number)
    assert call is not None and call.answered_at is not None
    sound = first_sound_s(call)
    assert sound is not None
    await server.phone_hang_up(call.call_id)
    return call.answered_at - dialled, sound


async def bare_call(server: LoopbackLiveKitServer, trunk: str, number: str) -> float:
    """A bare livekit.rtc agent places the call and sends a tone once answered: answer to first sound, s."""
    await server.add_phone(number, Phone(rings_for_s=RING_S))
    room_name = f"bare-{number[-4:]}"
    room = rtc.Room()
    await room.connect(server.url, server.mint_token("bare-agent", room_name))
    source = rtc.AudioSource(RATE, 1)
    track = rtc.LocalAudioTrack.create_audio_track("tone", source)
    await room.local_participant.publish_track(track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
    lkapi = api.LiveKitAPI(server.url, server.api_key, server.api_secret)
    tone = (0.3 * np.sin(2 * np.pi * 1000 * np.arange(RATE // 50) / RATE) * 32767).astype(np.int16)
    try:
        create = sip_pb.CreateSIPParticipantRequest(sip_trunk_id=trunk, sip_call_to=number, room_name=room_name,
                                                    participant_identity=f"sip-{number}", wait_until_answered=True)
        create.ringing_timeout.FromTimedelta(datetime.timedelta(seconds=30))
        await lkapi.sip.create_sip_participant(create)
        for _ in range(50):  # a second of tone, paced by the source
            await source.capture_frame(rtc.AudioFrame(tone.tobytes(), RATE, 1, tone.size))
        await until(lambda: (c := server.sip_call_to(number)) is not None and first_sound_s(c) is not None, 30,
                    f"the bare agent's tone on the call to {number}")
        call = server.sip_call_to(number)
        assert call is not None
        sound = first_sound_s(call)
        assert sound is not None
        await server.phone_hang_up(call.call_id)
        return sound
    finally:
        await lkapi.aclose()
        await room.disconnect()
        await source.aclose()


async def run(calls: int, report: Report) -> None:
    server = LoopbackLiveKitServer(api_key="devkey", api_secret="devsecret-for-the-dial-bench")
    await server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "DUPLEX_"))}
    logs = Path(tempfile.mkdtemp(prefix="dial-answer-"))
    worker = None
    try:
        trunk = await server.add_sip_trunk()
        worker = subprocess.Popen(
            [sys.executable, "-m", "duplex_agent.agent.app.cli", "start", "--agent-name", AGENT_NAME,
             "--plugin", "reference"], cwd=REPO,
            env={**env, "HF_HUB_OFFLINE": "1", "LIVEKIT_URL": server.url, "LIVEKIT_API_KEY": server.api_key,
                 "LIVEKIT_API_SECRET": server.api_secret},
            stdout=(logs / "worker.log").open("w"), stderr=subprocess.STDOUT)
        await server.wait_for_worker(AGENT_NAME, available=True, timeout=120)
        answered, agent, bare = [], [], []
        for n in range(calls):
            try:
                ring, sound = await worker_call(server, trunk, f"+1555200{n:04d}")
                floor = await bare_call(server, trunk, f"+1555300{n:04d}")
            except TimeoutError as exc:
                print(f"  call {n}: {exc} (left out)", flush=True)
                continue
            answered.append(1000 * ring)
            agent.append(1000 * sound)
            bare.append(1000 * floor)
            print(f"  call {n}: dispatch to answer {1000 * ring:.0f} ms (rings {1000 * RING_S:.0f}); answer to the "
                  f"agent's first sound {1000 * sound:.0f} ms; bare agent {1000 * floor:.0f} ms", flush=True)
        print(f"dispatch to answer (the far end's own time, left out): {summary(answered, 'ms')}")
        print(f"answer to the agent's first sound (greeting): {summary(agent, 'ms')}")
        print(f"answer to a bare agent's first sound (the floor): {summary(bare, 'ms')}")
        for q in (50, 95):
            report.add(f"dial.answer_to_first_sound_p{q}",
                       f"outbound call with a greeting: the far end's answer to the agent's first sound down its "
                       f"line, p{q}; floor: a bare livekit.rtc agent sending a tone once the same call is answered",
                       percentile(agent, q), floor=percentile(bare, q), unit="ms", n=len(agent), area="phone")
        report.write()
        print(f"(worker log in {logs})")
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="4 calls")
    args = parser.parse_args()
    print("== outbound calls: the far end's answer to the agent's first sound ==", flush=True)
    asyncio.run(run(4 if args.quick else args.calls, Report("dial_answer", quick=args.quick)))


if __name__ == "__main__":
    main()
