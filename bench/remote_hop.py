"""What the remote hop adds per event: against our own endpoint, and against the real vLLM-Omni 0.30.0.

Per trial: a 200 ms tone, commit, then the time from the commit to every event of the reply.
The callers of one server commit at the same moment, each on its own session, so load hits them
alike. Events are matched by kind and order within the reply (the 3rd ``response.output_audio.delta``
with the 3rd); the added latency of an event is the median over trials of the remote caller's
arrival minus the floor's in the same trial, and the figure is the median over the reply's events.

- **Our server** (the scripted model; our endpoint on loopback in this process): the remote backend
  (``RemoteBackend``) against two floors, the in-process runner (the whole hop: our server's
  websocket, loopback, our client) and a bare websocket client reading the same endpoint (what our
  client adds beyond the wire). Twice: a 5-word reply in one burst, and a 12-word reply paced a
  word every 80 ms, as the peer paces its audio chunks.
- **vLLM-Omni** (``devtools.omni_peer``: its real serving stack, scripted stages pacing the audio in
  real time; its own process): the remote backend against a bare websocket client reading the same
  server. vLLM-Omni cannot run inside this process, so this is the floor both servers share, and
  the ratio printed is vLLM-Omni's added latency over ours against that floor.

Run: python -m bench.remote_hop [trials] [--peer-trials N] [--quick]   (vLLM-Omni: needs .venv-omni, make omni-venv)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp.test_utils import TestServer

from bench.report import Report
from bench.stats import summary
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.remote.backend import RemoteBackend
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.agent.session.ports import Conversation, DuplexBackend
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.plugins.scripted import Script, ScriptedPlugin

TONE = (0.3 * np.sin(np.arange(3200) / 4)).astype(np.float32)  # 200 ms at 16 kHz
WARM_UP = 5
FIRST_AUDIO = f"{p.ResponseAudioDelta.type}#1"
DONE = f"{p.ResponseDone.type}#1"
#: The peer's reply: "reply N" and 3 words (0.9 s of audio, paced in real time).
PEER_WORDS = 3
#: The peer's code2wav chunk (devtools.omni_peer.scripted_stages.AUDIO_CHUNK_S).
PEER_CHUNK_S = 0.08
#: Beyond the reply's end, how long a vLLM-Omni caller waits before its next turn (our backend's
#: acknowledgement for it comes 0.5 s after the reply has had time to play).
PLAYED_OUT_MARGIN_S = 0.6
REPLY_TIMEOUT_S = 60.0

Arrivals = dict[str, float]  # event kind#order -> ms since the commit
Trial = Callable[[], Awaitable[Arrivals]]


class _Arrivals:
    """Stamps each event of one reply by kind and order, in ms since the commit."""

    def __init__(self) -> None:
        self.committed = time.perf_counter()
        self.arrivals: Arrivals = {}
        self._seen: Counter[str] = Counter()

    def stamp(self, kind: str) -> None:
        self._seen[kind] += 1
        self.arrivals[f"{kind}#{self._seen[kind]}"] = 1000 * (time.perf_counter() - self.committed)

    async def played_out(self, audio_ms: float) -> None:
        """Wait (after the reply, outside what is timed) until a caller playing the reply in real time
        from its first audio has heard it all, and our backend has acknowledged it for the caller
        (agent.remote.self_acks: half a second after). vLLM-Omni holds a reply until it is
        acknowledged, and a next turn committed sooner, its reply acknowledged as heard only in part
        (truncated), gets no response from vLLM-Omni 0.30.0."""
        heard_at = self.committed + (self.arrivals[FIRST_AUDIO] + audio_ms) / 1000 + PLAYED_OUT_MARGIN_S
        await asyncio.sleep(max(0.0, heard_at - time.perf_counter()))


async def open_conversation(backend: DuplexBackend, *, play_out: bool = False) -> tuple[Conversation, Trial]:
    """A conversation on a backend of ours (in-process or remote), and one trial on it
    (``play_out``: the trial ends once the reply has been heard, see ``_Arrivals.played_out``)."""
    conversation = await backend.open()
    conversation.send(p.SessionUpdate({"turn_detection": None}))

    async def trial() -> Arrivals:
        conversation.send(p.InputAudioBufferAppend(TONE))
        stamps = _Arrivals()
        conversation.send(p.InputAudioBufferCommit())
        audio_ms = 0.0
        async for event in conversation.events():
            stamps.stamp(event.type)
            if isinstance(event, p.ResponseAudioDelta):
                audio_ms = max(audio_ms, event.audio_start_ms + event.audio_ms)
            if isinstance(event, p.ResponseDone):
                assert FIRST_AUDIO in stamps.arrivals, "a reply without audio"
                if play_out:
                    await stamps.played_out(audio_ms)
                return stamps.arrivals
        raise RuntimeError("the conversation ended")

    return conversation, trial


def _pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((samples * 32767).astype("<i2").tobytes()).decode()


class WireCaller:
    """A bare websocket client on ``/v1/realtime``: it sends what our remote backend sends and reads
    the server's JSON as it comes, nothing more (the floor both servers share)."""

    def __init__(self, url: str, capabilities: DuplexCapabilities, *, omni: bool) -> None:
        self.url = url
        # vLLM-Omni answers a commit only with response_create (ours answers a bare one), and its caller
        # plays each reply out before the next turn (_Arrivals.played_out).
        self.omni = omni
        # The tone in appends of the server's unit, at most 100 ms each, as agent.remote.input.InputEncoder sends it.
        unit = capabilities.unit_samples * 16000 // capabilities.input_sample_rate
        step = unit if unit <= 1600 else unit // math.ceil(unit / 1600)
        self._appends = [_pcm16(TONE[n:n + step]) for n in range(0, len(TONE), step)]
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._last_reply: tuple[str, int] | None = None  # (response_id, audio ms) to acknowledge

    async def open(self) -> WireCaller:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(self.url, max_msg_size=16 * 1024 * 1024)
        await self._send({"type": "session.update", "session": {"turn_detection": None}})
        while (await self._receive())["type"] != "session.updated":
            pass
        return self

    async def trial(self) -> Arrivals:
        if self._last_reply is not None:  # heard in full: vLLM-Omni takes no next turn before this
            response_id, audio_ms = self._last_reply
            await self._send({"type": "playback.ack", "response_id": response_id, "played_ms": audio_ms,
                              "committed_ms": audio_ms})
        for pcm in self._appends:
            await self._send({"type": "input_audio_buffer.append", "audio": pcm, "format": "pcm16",
                              "sample_rate_hz": 16000})
        commit = {"type": "input_audio_buffer.commit", **({"response_create": True} if self.omni else {})}
        stamps = _Arrivals()
        await self._send(commit)
        audio_ms = 0
        while True:
            event = await self._receive()
            stamps.stamp(event["type"])
            if event["type"] == "error":
                raise RuntimeError(f"the server answered an error: {event}")
            if event["type"] == "response.output_audio.delta":
                audio_ms = int(event.get("metadata", {}).get("audio_duration_ms", audio_ms))
            if event["type"] == "response.done":
                assert FIRST_AUDIO in stamps.arrivals, "a reply without audio"
                self._last_reply = (event["response"]["id"], audio_ms)
                if self.omni:
                    await stamps.played_out(audio_ms)
                return stamps.arrivals

    async def _send(self, message: dict) -> None:
        assert self._ws is not None
        await self._ws.send_str(json.dumps(message))

    async def _receive(self) -> dict:
        assert self._ws is not None
        message = await self._ws.receive(REPLY_TIMEOUT_S)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"the server's socket ended: {message.type} {message.data}")
        return json.loads(message.data)

    async def close(self) -> None:
        if self._ws is not None:
            await self._send({"type": "session.close"})
            await self._ws.close()
        if self._http is not None:
            await self._http.close()


async def side_by_side(trials: int, callers: dict[str, Trial]) -> dict[str, list[Arrivals]]:
    """Per caller, the arrivals of every trial (after the warm-up ones). In each trial every caller
    commits at once (each on its own session), so a change of load hits them alike; who commits
    first turns round trial by trial."""
    names = list(callers)
    per_caller: dict[str, list[Arrivals]] = {name: [] for name in names}
    for i in range(trials + WARM_UP):
        order = names[i % len(names):] + names[:i % len(names)]
        arrivals = await asyncio.gather(*(callers[name]() for name in order))
        if i >= WARM_UP:
            for name, got in zip(order, arrivals, strict=True):
                per_caller[name].append(got)
    return per_caller


def added_per_event(floor: list[Arrivals], remote: list[Arrivals]) -> dict[str, float]:
    """For each event both saw in most trials: the median over trials of remote minus floor (same trial)."""
    keys = [key for key in remote[0] if sum(key in f and key in r for f, r in zip(floor, remote, strict=True))
            > len(floor) // 2]
    return {key: statistics.median(r[key] - f[key] for f, r in zip(floor, remote, strict=True) if key in f and key in r)
            for key in keys}


def _kinds(trials: list[Arrivals]) -> set[str]:
    return {key for arrivals in trials for key in arrivals}


def report_added(label: str, floor: list[Arrivals], remote: list[Arrivals]) -> float:
    """Print the per-event table; return the median added latency over the reply's events."""
    added = added_per_event(floor, remote)
    print(f"  {label}, {len(added)} events of the reply (floor only: {sorted(_kinds(floor) - _kinds(remote)) or 'none'}; "
          f"remote only: {sorted(_kinds(remote) - _kinds(floor)) or 'none'}):")
    for key, ms in added.items():
        print(f"    {key:<56} floor {statistics.median(f[key] for f in floor if key in f):7.2f} ms  remote "
              f"{statistics.median(r[key] for r in remote if key in r):7.2f} ms  added {ms:6.2f} ms")
    per_event = statistics.median(added.values())
    print(f"  => adds p50 {per_event:.2f} ms per event (max {max(added.values()):.2f} ms), "
          f"{added[FIRST_AUDIO]:.2f} ms to the first audio")
    return per_event


def add_first_audio(report: Report, figure: str, server: str, floor: list[Arrivals], remote: list[Arrivals],
                    per_event: float) -> None:
    """Commit -> first audio through the remote backend, beside a bare websocket reader of the same server."""
    report.add(figure, f"{server}: commit -> first audio delta through our remote backend, p50; floor: a bare "
               f"websocket reader of the same server (our client adds p50 {per_event:.2f} ms per event)",
               statistics.median(t[FIRST_AUDIO] for t in remote), floor=statistics.median(t[FIRST_AUDIO] for t in floor),
               unit="ms", n=len(remote), area="backends")


def print_timings(name: str, trials: list[Arrivals]) -> None:
    print(f"  {name:<20} commit -> first audio delta: {summary([t[FIRST_AUDIO] for t in trials], 'ms', digits=2)}")
    print(f"  {name:<20} commit -> response.done:     {summary([t[DONE] for t in trials], 'ms', digits=2)}")


async def our_server(trials: int, *, words: int, word_delay_s: float, report: Report | None = None) -> float:
    """Our endpoint in this process; returns what our client adds per event beyond a bare websocket."""
    reply = " ".join(f"word{n}" for n in range(1, words + 1))
    plugin = ScriptedPlugin(as_float32_audio, Script(reply=reply, word_delay_s=word_delay_s))
    local = LocalBackend(plugin, plugin.build_local_engine())
    server = TestServer(build_app(local, Settings(), with_webrtc=False), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/v1/realtime?duplex=1")).replace("http", "ws", 1)
    remote = RemoteBackend(url)
    await remote.start()
    (in_process, local_trial), (over_remote, remote_trial) = await open_conversation(local), await open_conversation(remote)
    wire = await WireCaller(url, remote.capabilities, omni=False).open()
    seen = await side_by_side(trials, {"in-process runner": local_trial, "bare websocket": wire.trial,
                                     "remote backend": remote_trial})
    pace = f"a word every {1000 * word_delay_s:g} ms" if word_delay_s else "in one burst"
    print(f"our server: scripted model, {words}-word reply {pace}, {trials} trials each (after {WARM_UP} warm-up), "
          "loopback, one process")
    for name, per_event in seen.items():
        print_timings(name, per_event)
    report_added("the remote hop (remote backend - in-process runner)", seen["in-process runner"],
                 seen["remote backend"])
    beyond_wire = report_added("our client beyond the wire (remote backend - bare websocket)",
                               seen["bare websocket"], seen["remote backend"])
    if report is not None:
        add_first_audio(report, "remote_hop.our_server_added", f"our server, {words}-word reply {pace}",
                        seen["bare websocket"], seen["remote backend"], beyond_wire)
    await wire.close()
    for conversation in (in_process, over_remote):
        await conversation.close()
    await remote.close()
    await server.close()
    await local.close()
    return beyond_wire


async def omni_peer(trials: int, report: Report) -> float | None:
    """vLLM-Omni in its own process; what our client adds per event beyond a bare websocket (None: no peer)."""
    from tests.omni_peer.processes import OMNI_PYTHON, PEER_START_TIMEOUT_S, OmniPeer, free_port

    if not OMNI_PYTHON.exists():
        print("vLLM-Omni: not measured, .venv-omni is missing (make omni-venv)")
        return None
    with tempfile.TemporaryDirectory(prefix="remote-hop-") as folder:
        peer = OmniPeer(free_port(), Path(folder) / "omni-peer.log", sample_rate=24000, words=PEER_WORDS)
        peer.start()
        try:
            await asyncio.to_thread(peer.ready, PEER_START_TIMEOUT_S)
            remote = RemoteBackend(peer.realtime_url)
            await remote.start()
            conversation, remote_trial = await open_conversation(remote, play_out=True)
            wire = await WireCaller(peer.realtime_url, remote.capabilities, omni=True).open()
            seen = await side_by_side(trials, {"bare websocket": wire.trial, "remote backend": remote_trial})
            print(f"vLLM-Omni 0.30.0 (devtools.omni_peer, scripted stages, 'reply N' + {PEER_WORDS} words paced in "
                  f"real time): {trials} trials each (after {WARM_UP} warm-up), loopback, its own process")
            for name, per_event in seen.items():
                print_timings(name, per_event)
            beyond_wire = report_added("our client beyond the wire (remote backend - bare websocket)",
                                       seen["bare websocket"], seen["remote backend"])
            add_first_audio(report, "remote_hop.vllm_omni_added", "vLLM-Omni 0.30.0 (scripted stages, paced)",
                            seen["bare websocket"], seen["remote backend"], beyond_wire)
            await wire.close()
            await conversation.close()
            await remote.close()
        finally:
            peer.stop()
    return beyond_wire


async def main(trials: int, peer_trials: int, report: Report) -> None:
    burst = await our_server(trials, words=5, word_delay_s=0.0, report=report if peer_trials <= 0 else None)
    if peer_trials <= 0:
        return
    # Paced as the peer's audio is (a chunk every 80 ms), so its events come as spread out as vLLM-Omni's.
    paced = await our_server(peer_trials, words=12, word_delay_s=PEER_CHUNK_S, report=report)
    theirs = await omni_peer(peer_trials, report)
    if theirs is None:
        return
    print("added per event beyond a bare websocket (median over trials of remote backend - bare websocket in the same "
          "trial; median over the reply's events):")
    for label, ours in ((f"paced as the peer ({1000 * PEER_CHUNK_S:g} ms)", paced), ("in one burst", burst)):
        ratio = f"{theirs / ours:.3f}x" if ours > 0 else "n/a (ours added nothing)"
        print(f"  vLLM-Omni {theirs:.2f} ms vs our server {label} {ours:.2f} ms: ratio {ratio}")
    report.add("remote_hop.client_added_per_event", "what our remote client adds per event beyond a bare websocket "
               "reader, against vLLM-Omni 0.30.0; floor: the same against our own server, paced alike", theirs,
               floor=paced, unit="ms", n=peer_trials, compare="ratio", area="backends")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=100, help="trials against our server")
    parser.add_argument("--peer-trials", type=int, default=30,
                        help="trials against vLLM-Omni (each about a second: its audio is paced); 0: skip it")
    parser.add_argument("--quick", action="store_true", help="20 trials against our server, 8 against vLLM-Omni")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.peer_trials = min(args.trials, 20), min(args.peer_trials, 8)
    # SIGTERM (as `timeout` sends it) unwinds the run as Ctrl-C does, so the peer's process is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = Report("remote_hop", quick=args.quick)
    asyncio.run(main(args.trials, args.peer_trials, report))
    report.write()
