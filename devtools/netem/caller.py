"""A direct-WebRTC caller (aiortc) that runs inside the caller's namespace, driven line by line.

Started by ``devtools.netem.calls.CallerProcess`` as
``ip netns exec NS python -m devtools.netem.caller --url URL --ice-address A --clips DIR [--sender S]``.

How the caller sends its voice (``--sender``):
- ``libopus-rr`` (the default; as browsers and phone apps on libwebrtc do): mono Opus from
  libopus with in-band FEC, its expected loss set from the worker's RTCP receiver reports
  (the worker's own sending pieces: ``PlayoutTrack``'s encoder and ``LossFollower``);
- ``aiortc-opus``: aiortc's own Opus encoder (stereo, 96 kb/s, no FEC), as a plain aiortc
  peer sends.
It reads one JSON command per line on stdin and answers each with one JSON line on
stdout (``{"ok": false, "error": ...}`` when the step did not happen):

- ``{"cmd": "connect"}``: wait for the worker's /healthz, offer, wait until connected, the
  data channel open and the agent's audio flowing; how long each took (``connect_ms``: offer
  -> ICE and DTLS connected; ``channel_ms``, ``audio_ms``: connected -> the data channel open,
  the agent's first frame heard). Through loss the data channel is the slow part: aiortc's
  SCTP, at both ends, sends INIT and COOKIE-ECHO again only every 3 s, and a DATA chunk
  before any round trip was measured also 3 s later (RTO.Initial); DTLS retries at 1, 2, 4 s;
- ``{"cmd": "turn"}``: say ``question.npy``; the worker's recognizer's transcript, the reply's
  text and the caller-heard turn latency (last speech frame sent -> first loud reply frame heard);
- ``{"cmd": "barge_in"}``: say ``long.npy``, and once the reply has been heard for 0.5 s, say
  ``stop.npy`` over it; barge-in as heard (first loud frame of the interruption sent -> last
  loud frame of the agent heard) and whether the agent stopped (cancelled or cleared, then quiet);
  the agent may then answer the interruption;
- ``{"cmd": "state"}``: the peer connection's and the data channel's states, the close reason;
- ``{"cmd": "hangup"}``: close the call.

Times are this process's clock; nothing here knows about the impairments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import av
import numpy as np
from aiortc import RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from devtools.caller_peer import FRAME, CallerPeer, Mic
from duplex_agent.webrtc.direct.host_address import candidates_on
from duplex_agent.webrtc.direct.ice_consent import keep_consent
from duplex_agent.webrtc.direct.loss_feedback import LossFollower
from duplex_agent.webrtc.direct.tracks import PlayoutTrack

REPLY_HEARD_BEFORE_BARGE_IN = 25  # loud frames (0.5 s) of the reply before the caller talks over it
QUIET_AFTER_S = 0.5  # the barge-in window ends this long after the interruption's last speech
STOPPED_QUIET_FRAMES = 15  # the agent stopped: after the cut, this many frames (0.3 s) heard quiet in a row
#: Generous deadlines: on a loaded machine a caller can take several times a clip's length to send
#: it, and the handshakes' retransmissions through a lossy link take their time (aiortc's SCTP
#: resends every 3 s, so through heavy loss a data channel can take tens of seconds to open).
SEND_TIMEOUT_S = 120
SENDERS = ("libopus-rr", "aiortc-opus")


class AiortcEncodedTrack(MediaStreamTrack):
    """The microphone as raw 20 ms frames, for aiortc's own Opus encoder: paced by a
    ``PlayoutTrack`` whose packets are not sent (only its clock is used)."""

    kind = "audio"

    def __init__(self, next_frame: Callable[[], np.ndarray]) -> None:
        super().__init__()
        self._next_frame = next_frame
        self._samples = np.zeros(FRAME, np.int16)
        self._clock = PlayoutTrack(self._take)

    def _take(self) -> np.ndarray:
        self._samples = self._next_frame()
        return self._samples

    async def recv(self) -> av.AudioFrame:
        packet = await self._clock.recv()
        frame = av.AudioFrame.from_ndarray(self._samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, packet.pts, packet.time_base
        return frame

    def stop(self) -> None:
        self._clock.stop()
        super().stop()


class Call(CallerPeer):
    def __init__(self, url: str, address: str, clips: dict[str, np.ndarray], sender: str) -> None:
        self.url = url
        self.address = address
        self.clips = clips
        self.mic = Mic()
        self.loss_follower: LossFollower | None = None
        if sender == "aiortc-opus":
            super().__init__(AiortcEncodedTrack(self.mic.next_frame))
        else:
            track = PlayoutTrack(self.mic.next_frame)
            self.loss_follower = LossFollower(track.encoder)
            super().__init__(track)

    # ---- commands ----

    async def connect(self) -> dict:
        started = time.perf_counter()
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(self.url + "/healthz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.perf_counter() - started > 300:
                    return {"ok": False, "error": "the worker did not answer /healthz in 300 s"}
                await asyncio.sleep(0.5)
            offered = time.perf_counter()
            with candidates_on(self.address):
                await self.pc.setLocalDescription(await self.pc.createOffer())
            offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
            # Through the TUN link an offer's body arrives in several TCP segments: the worker
            # must read it whole, so a refusal here is a failure, not a retry.
            async with http.post(self.url + "/api/offer", json=offer) as response:
                text = await response.text()
                if response.status != 200:
                    return {"ok": False, "error": f"offer answered {response.status}: {text[:300]}"}
                answer = json.loads(text)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        keep_consent(self.pc)  # as a browser keeps it (RFC 7675's 30 s), not aioice's few seconds
        if not await self.until(lambda: self.pc.connectionState in ("connected", "failed", "closed"),
                                SEND_TIMEOUT_S):
            return {"ok": False, "error": f"not connected after {SEND_TIMEOUT_S} s"}
        if self.pc.connectionState != "connected":
            return {"ok": False, "error": f"connection {self.pc.connectionState}"}
        connected = time.perf_counter()
        phases = {"connect_ms": round(1000 * (connected - offered))}
        for name, what, ready in (("channel_ms", "the data channel", lambda: self.channel.readyState == "open"),
                                  ("audio_ms", "the agent's audio", lambda: self.frames_heard > 0)):
            if not await self.until(ready, SEND_TIMEOUT_S):
                return {"ok": False, **phases, "error": f"{what} did not start {SEND_TIMEOUT_S} s after connecting"}
            phases[name] = round(1000 * (time.perf_counter() - connected))
        if self.loss_follower is not None:
            self.tasks.append(asyncio.create_task(self.loss_follower.follow(self.sender)))
        return {"ok": True, **phases}

    async def turn(self) -> dict:
        mark, loud_mark = len(self.events), len(self.loud_at)
        self.mic.say(self.clips["question"])
        if not await self.until(lambda: self.mic.last_speech_sent_at is not None, SEND_TIMEOUT_S):
            return {"ok": False, "error": "the question was not sent"}
        said_at = self.mic.last_speech_sent_at
        got = await self.until(lambda: self.events_since(mark, "response.output_audio_transcript.done")
                               or self.events_since(mark, "response.done"), 60)
        heard = [e["transcript"] for e in
                 self.events_since(mark, "conversation.item.input_audio_transcription.completed")]
        replies = [e["transcript"] for e in self.events_since(mark, "response.output_audio_transcript.done")]
        reply_loud = lambda: [t for t in self.loud_at[loud_mark:] if t > said_at]  # noqa: E731
        await self.until(lambda: bool(reply_loud()), 15)
        turn_ms = round(1000 * (reply_loud()[0] - said_at)) if reply_loud() else None
        # Ready for the next step once the agent has finished speaking.
        await self.until(lambda: self._back_to_listening(mark), 60)
        seen = sorted({e.get("type", "?") for _, e in self.events[mark:]})
        return {"ok": bool(got), "heard": " ".join(heard), "reply": " ".join(replies), "turn_ms": turn_ms,
                "error": None if got else f"no reply in 60 s (heard {' '.join(heard)!r}; events: {', '.join(seen)})"}

    def _back_to_listening(self, mark: int) -> bool:
        states = [e["state"] for e in self.events_since(mark, "agent.state")]
        return "speaking" in states and states[-1] == "listening"

    async def barge_in(self) -> dict:
        loud_mark = len(self.loud_at)
        self.mic.say(self.clips["long"])
        if not await self.until(lambda: self.mic.last_speech_sent_at is not None, SEND_TIMEOUT_S):
            return {"ok": False, "error": "the long question was not sent"}
        said_at = self.mic.last_speech_sent_at
        if not await self.until(lambda: sum(t > said_at for t in self.loud_at[loud_mark:])
                                >= REPLY_HEARD_BEFORE_BARGE_IN, 60):
            return {"ok": False, "error": "the reply to the long question was not heard"}
        stop_mark = len(self.events)
        self.mic.say(self.clips["stop"])
        if not await self.until(lambda: self.mic.last_speech_sent_at is not None, SEND_TIMEOUT_S):
            return {"ok": False, "error": "the interruption was not sent"}
        onset, window_end = self.mic.first_loud_sent_at, self.mic.last_speech_sent_at + QUIET_AFTER_S
        await self.until(lambda: time.perf_counter() >= window_end, QUIET_AFTER_S + 1)  # the window is the measure
        cut = lambda: bool(self.events_since(stop_mark, "output_audio_buffer.cleared") or [  # noqa: E731
            e for e in self.events_since(stop_mark, "response.done") if e.get("status") == "cancelled"])
        await self.until(cut, 30)
        loud = [t for t in self.loud_at if onset <= t <= window_end]
        last_loud = loud[-1] if loud else onset
        # Quiet counted in frames heard, not in this process's time: a loaded caller reads the
        # agent's frames late, in bursts.
        quiet = await self.until(lambda: self.quiet_run >= STOPPED_QUIET_FRAMES, 30)
        return {"ok": True, "barge_in_ms": round(1000 * (last_loud - onset)), "stopped": cut() and quiet,
                **self._fec_planned()}

    def _fec_planned(self) -> dict:
        """The expected loss (percent) the caller's encoder plans FEC for now, and the receiver reports it followed."""
        if self.loss_follower is None:
            return {}
        return {"expected_loss_percent": self.loss_follower.encoder.expected_loss_percent,
                "reports": len(self.loss_follower.reports)}

    def state(self) -> dict:
        return {"ok": True, "connection": self.pc.connectionState, "channel": self.channel.readyState,
                "frames_heard": self.frames_heard}

    async def hangup(self) -> dict:
        await self.close()
        return {"ok": True}


async def serve(args: argparse.Namespace) -> None:
    clips = {name: np.load(Path(args.clips) / f"{name}.npy").astype(np.float32) for name in ("question", "long", "stop")}
    call: Call | None = None
    while line := await asyncio.to_thread(sys.stdin.readline):
        command = json.loads(line)["cmd"]
        try:
            if command == "connect":
                if call is not None:
                    await call.hangup()
                call = Call(args.url.rstrip("/"), args.ice_address, clips, args.sender)
                answer = await call.connect()
            elif call is None:
                answer = {"ok": False, "error": "not connected"}
            elif command in ("turn", "barge_in", "hangup"):
                answer = await getattr(call, command)()
            elif command == "state":
                answer = call.state()
            else:
                answer = {"ok": False, "error": f"unknown command {command!r}"}
        except Exception as exc:  # reported to the driver, which decides
            answer = {"ok": False, "error": repr(exc)}
        print(json.dumps(answer), flush=True)
    if call is not None:
        await call.hangup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the worker's base URL inside the namespaces")
    parser.add_argument("--ice-address", required=True, help="this namespace's address, for ICE")
    parser.add_argument("--clips", required=True, help="folder of question.npy, long.npy, stop.npy (48 kHz)")
    parser.add_argument("--sender", choices=SENDERS, default=SENDERS[0], help="how the caller's voice is encoded")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
