"""Barge-in as a browser caller gets it: headless Chromium on the page, in its direct mode and its LiveKit
mode (livekit-client through the loopback LiveKit server), its microphone a WAV file, under each set of
audio constraints, beside an aiortc caller saying the same in the same run.

The worker is ``duplex-agent dev`` with the reference model (Whisper hears the caller, Piper speaks)
answering "tell me ..." with a long story (``StoryPlugin``), a process of its own: it serves the page and
direct calls, and is dispatched to the page's LiveKit room by the page's dev token. The microphone's
file holds a few cycles: a question, then, while the story plays, an interruption ("Stop, please wait
a moment. ..."), then room for the short answer to it.

Each browser call asks for one set of audio constraints: a script injected before the page loads
replaces the audio constraints the page passes to getUserMedia (``page`` keeps the page's own). The
same script taps, in one AudioContext, the microphone track as the page sends it (after the
browser's echo canceller, noise suppression and gain control), a second capture of the same fake
device with no processing (the file as the device played it) and the agent's audio where the page
plays it, as the level of each 512-sample block on the context's clock. The interruption's first
sound in the unprocessed capture is its onset, beside the agent's audio on the same clock:

- onset-to-quiet: the interruption's first sound as the device played it -> the agent's audio quiet
  at the page (100 ms of it). A canceller that swallows the interruption's start shows here, and in
  ``swallowed_ms`` (the onset -> its first sound in the track the page sends);
- words: the share of the interruption's words in what the model heard (the user's transcript line
  after the question's), and whether its first two words are there.

The floor is an aiortc caller (no audio processing) playing the same file to the same worker, direct:
the same two figures, its onset the time the onset's frame was handed to its sender. It is the floor of
both modes, so a LiveKit-mode figure includes the SFU's hop.

A fake microphone carries no echo of the agent, so these figures show what each canceller costs a
caller, not what it saves a speakerphone. Prints each call's barge-ins and a summary; never passes
or fails on time.

Run: python -m bench.browser_bargein [--cycles 2] [--constraints page,aec_ns_agc,ns_agc,none]
     [--modes direct,livekit] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.call_rig import Service, free_port, start_loopback_server, wait_for_metrics
from bench.report import Report
from bench.stats import percentile
from duplex_agent.plugins.engines.inprocess import InProcessEngine
from duplex_agent.plugins.reference.plugin import ReferencePlugin

RATE = 48000
BLOCK_S = 0.01  # the file's and the aiortc caller's level blocks
QUIET_RUN_S = 0.1  # the agent's audio this long under LOUD: stopped
LOUD = 0.01  # RMS of a block of the agent's speech
MIC_SOUND = 0.002  # RMS of a block of the caller's own speech in the tapped microphone
INTERRUPTION = "Stop, please wait a moment. I have another question."
QUESTIONS = (
    "Tell me a story about the harbour.",
    "Tell me about the mountain railway.",
    "Tell me about the winter garden.",
    "Tell me about the night train.",
)
# Audio constraints by name; None keeps what the page asks for.
CONSTRAINTS: dict[str, dict[str, bool] | None] = {
    "page": None,
    "aec_ns_agc": {"echoCancellation": True, "noiseSuppression": True, "autoGainControl": True},
    "aec": {"echoCancellation": True, "noiseSuppression": False, "autoGainControl": False},
    "ns_agc": {"echoCancellation": False, "noiseSuppression": True, "autoGainControl": True},
    "none": {"echoCancellation": False, "noiseSuppression": False, "autoGainControl": False},
}

# Injected before the page's own scripts: replace the audio constraints, and tap the microphone as
# sent and the agent's audio as played in one AudioContext (one clock for both).
TAP_SCRIPT = """
(() => {
  const override = %s;
  const bench = window.__bench = {asked: null, settings: null, blocks: [], clock: null};
  const media = navigator.mediaDevices;
  if (!media) return;
  const original = media.getUserMedia.bind(media);
  media.getUserMedia = async (constraints) => {
    bench.asked = JSON.parse(JSON.stringify(constraints));
    const stream = await original(override ? {...constraints, audio: override} : constraints);
    // The same device again, unprocessed: the file as the device played it, on the tap's clock.
    const raw = await original({audio: {echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
    bench.settings = stream.getAudioTracks()[0].getSettings();
    tap(stream, raw);
    return stream;
  };
  const rms = (samples) => {
    let sum = 0;
    for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
    return Math.sqrt(sum / samples.length);
  };
  function tap(mic, raw) {
    const context = new AudioContext();
    bench.clock = context;
    const merger = context.createChannelMerger(3);
    context.createMediaStreamSource(mic).connect(merger, 0, 0);
    context.createMediaStreamSource(raw).connect(merger, 0, 2);
    const processor = context.createScriptProcessor(512, 3, 1);
    merger.connect(processor);
    const mute = context.createGain();
    mute.gain.value = 0;
    processor.connect(mute).connect(context.destination);
    processor.onaudioprocess = (event) => {
      const input = event.inputBuffer;
      bench.blocks.push([event.playbackTime, rms(input.getChannelData(0)), rms(input.getChannelData(1)),
                         rms(input.getChannelData(2))]);
    };
    const player = document.getElementById("agent-audio");
    let attached = null;
    setInterval(() => {
      const stream = player.srcObject;
      if (stream && stream !== attached && stream.getAudioTracks().length) {
        attached = stream;
        context.createMediaStreamSource(stream).connect(merger, 0, 1);
      }
    }, 20);
  }
})();
"""


STORY = ("Once upon a time there was a small harbour town by the sea, where the boats went out at dawn and came "
         "back at dusk with their nets full of fish. The children ran along the quay to meet them, the cooks "
         "of the town came down to the market to choose the best of the catch, and the old captain sat on his "
         "bench by the lighthouse and told anyone who would listen about the storms he had sailed through.")


class StoryResponder:
    """Replies to "tell me ..." with the same long story: a reply that starts as soon as the question is
    heard, whatever its length, and runs long enough that an interruption a few seconds after the
    question lands inside it on a slow machine too."""

    async def respond(self, history: object, user_text: str | None, *, tools: object = (),
                      tool_choice: object = "auto") -> AsyncIterator[str]:
        if user_text is None:
            return
        # Anything but a request for a story (an interruption) gets a short answer, so the next
        # question comes after it, not over it.
        for word in re.findall(r"\s*\S+", STORY if "tell me" in user_text.lower() else "All right, go on."):
            yield word


class StoryPlugin(ReferencePlugin):
    """The reference model (Whisper hears the caller, Piper speaks) telling the story when asked."""

    def build_local_engine(self) -> InProcessEngine:
        from duplex_agent.plugins.reference import plugin

        build = plugin.make_responder
        plugin.make_responder = lambda name, settings: StoryResponder()  # type: ignore[assignment]
        try:
            return super().build_local_engine()
        finally:
            plugin.make_responder = build


@dataclass
class Timeline:
    """The microphone's file: the audio and, in seconds from its start, each question's and interruption's sound."""

    audio: np.ndarray
    questions: list[tuple[float, float]] = field(default_factory=list)  # (first sound, last sound)
    interruptions: list[float] = field(default_factory=list)  # first sound


def sound_span(audio: np.ndarray) -> tuple[float, float]:
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return float(loud[0]) / RATE, float(loud[-1]) / RATE


def build_timeline(cycles: int, lead_s: float, gap_s: float) -> Timeline:
    from devtools.speech import speak

    parts: list[np.ndarray] = [np.zeros(int(2.0 * RATE), np.float32)]
    timeline = Timeline(np.zeros(0, np.float32))
    at = parts[0].size / RATE
    interruption = speak(INTERRUPTION, RATE)
    for cycle in range(cycles):
        question = speak(QUESTIONS[cycle % len(QUESTIONS)], RATE)
        first, last = sound_span(question)
        timeline.questions.append((at + first, at + last))
        # The interruption's first sound lead_s after the question's last: inside the reply.
        silence = np.zeros(int((lead_s - (question.size / RATE - last) - sound_span(interruption)[0]) * RATE),
                           np.float32)
        parts += [question, silence]
        at += (question.size + silence.size) / RATE
        timeline.interruptions.append(at + sound_span(interruption)[0])
        parts += [interruption, np.zeros(int(gap_s * RATE), np.float32)]
        at += (interruption.size / RATE) + gap_s
    timeline.audio = np.concatenate(parts)
    return timeline


@dataclass
class BargeIn:
    into_reply_ms: float | None  # the onset, after the reply's first loud audio
    onset_to_quiet_ms: float | None
    heard: str  # the user's transcript line taken for the interruption
    words: float  # share of the interruption's words in it
    first_words: bool
    swallowed_ms: float | None = None  # the onset -> its first sound in the microphone as the page sent it


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def score_words(heard: str) -> tuple[float, bool]:
    wanted, got = words_of(INTERRUPTION), set(words_of(heard))
    return sum(word in got for word in wanted) / len(wanted), all(word in got for word in wanted[:2])


def share_of(wanted: str, line: str) -> float:
    words = words_of(wanted)
    got = set(words_of(line))
    return sum(word in got for word in words) / len(words)


def interruption_lines(user_lines: list[str], cycles: int) -> list[str]:
    """What the model heard after each question's line, up to the next question's: the interruption,
    in one line or split where the worker ended a turn inside it ("" where it never heard it)."""
    is_question = [any(share_of(q, line) >= 0.6 for q in QUESTIONS) for line in user_lines]
    found, start = [], 0
    for cycle in range(cycles):
        question = QUESTIONS[cycle % len(QUESTIONS)]
        index = next((i for i in range(start, len(user_lines)) if share_of(question, user_lines[i]) >= 0.6), None)
        if index is None:
            found.append("")
            continue
        start = index + 1
        end = next((i for i in range(start, len(user_lines)) if is_question[i]), len(user_lines))
        found.append(" ".join(user_lines[start:end]))
    return found


def measure(agent: list[tuple[float, float]], onset: float, question_end: float) -> tuple[float | None, float | None]:
    """(the onset after the reply's first loud block, the onset -> the agent quiet for QUIET_RUN_S), in ms;
    ``agent`` is (time, RMS) of the agent's audio on the onset's clock."""
    reply = next((t for t, level in agent if t > question_end and level > LOUD), None)
    if reply is None or reply > onset:
        return (None if reply is None else round(1000 * (onset - reply), 1)), None
    quiet_since = None
    for t, level in agent:
        if t < onset:
            continue
        if level > LOUD:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = t
        elif t - quiet_since >= QUIET_RUN_S:
            return round(1000 * (onset - reply), 1), round(1000 * (quiet_since - onset), 1)
    return round(1000 * (onset - reply), 1), None


# ---------------------------------------------------------------- the browser caller


def join_livekit_room(browser, room: str) -> None:  # noqa: ANN001
    """The page's LiveKit mode: a dev token for ``room`` (which dispatches the worker), then connect."""
    browser.click("mode-livekit")
    browser.wait_for_text("lk-get-token", "Get a dev token", 10)
    browser.driver.execute_script("const e = document.getElementById('lk-room'); e.value = arguments[0];"
                                  "e.dispatchEvent(new Event('input'));", room)
    browser.click("lk-get-token")
    browser.wait_for_text("lk-token-info", f"Room {room} as caller-", 10)
    browser.click("connect")


def browser_call(url: str, wav: Path, timeline: Timeline, constraints: dict[str, bool] | None, room: str | None,
                 ) -> tuple[list[BargeIn], dict]:
    """One call of the page; ``room``: in LiveKit mode, else direct."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.webrtc.browser import Browser

    browser = Browser(fake_mic_wav=wav)
    try:
        browser.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                       {"source": TAP_SCRIPT % json.dumps(constraints)})
        browser.open(url)
        if room is None:
            browser.click("connect")
        else:
            join_livekit_room(browser, room)
        browser.wait_for_text("status", "Connected", 60)
        duration = timeline.audio.size / RATE
        # The tap starts with the microphone, so its clock runs about level with the file.
        WebDriverWait(browser.driver, duration + 60, poll_frequency=0.5).until(
            lambda d: d.execute_script("const b = window.__bench; return b.clock && b.clock.currentTime;")
            >= duration)
        # The answer to the last interruption shows that all of it was heard and transcribed.
        with contextlib.suppress(TimeoutException):
            WebDriverWait(browser.driver, 30, poll_frequency=0.5).until(lambda d: d.execute_script(
                "const last = document.querySelector('#transcript li:last-child');"
                "return last && last.classList.contains('agent');"))
        bench = browser.driver.execute_script(
            "const b = window.__bench; return {asked: b.asked, settings: b.settings, blocks: b.blocks};")
        user_lines = browser.driver.execute_script(
            "return Array.from(document.querySelectorAll('#transcript li.user .text'), (e) => e.textContent);")
        page_barge = browser.text("fig-barge")
        browser.click("connect")  # hang up
    finally:
        browser.close()
    blocks = [(float(t), float(mic), float(agent), float(raw)) for t, mic, agent, raw in bench["blocks"]]
    settings = bench["settings"] or {}
    info = {"asked": bench["asked"], "echoCancellation": settings.get("echoCancellation"),
            "noiseSuppression": settings.get("noiseSuppression"),
            "autoGainControl": settings.get("autoGainControl"), "page_barge_in": page_barge,
            "user_lines": user_lines}
    agent = [(t, level) for t, _, level, _ in blocks]
    raw = [(t, level, 0.0) for t, _, _, level in blocks]
    heard = interruption_lines(user_lines, len(timeline.interruptions))
    found = []
    offset = None
    for cycle, ((question_on, question_end), onset) in enumerate(zip(timeline.questions, timeline.interruptions,
                                                                       strict=True)):
        # A starved fake device plays its file slower than real time: each cycle is tied to the clock
        # anew, at its question's last sound in the unprocessed capture, then the interruption's
        # first sound there.
        seen_end = question_end_seen(raw, question_on + (offset if offset is not None else 0.0),
                                     first=offset is None)
        if seen_end is None:
            info["error"] = f"question {cycle + 1} never showed in the unprocessed microphone"
            break
        offset = seen_end - question_end
        played = next((t for t, level, _ in raw if t >= seen_end + 0.5 and level > MIC_SOUND), None)
        if played is None:
            info["error"] = f"interruption {cycle + 1} never showed in the unprocessed microphone"
            break
        offset = played - onset
        into, quiet = measure(agent, played, seen_end)
        words, first = score_words(heard[cycle])
        sent = next((t for t, mic, _, _ in blocks if t >= played - 0.2 and mic > MIC_SOUND), None)
        found.append(BargeIn(into, quiet, heard[cycle], words, first,
                             None if sent is None else round(1000 * (sent - played), 1)))
    return found, info


def question_end_seen(blocks: list[tuple[float, float, float]], expected_on: float, *, first: bool) -> float | None:
    """The question's last sound in a tapped microphone ((time, level, _) blocks): the end of the first sound after
    ``expected_on`` (less a margin for drift) that a second of silence follows."""
    start = -1.0 if first else expected_on - 1.5
    last = None
    for t, mic, _ in blocks:
        if t < start:
            continue
        if mic > MIC_SOUND:
            last = t
        elif last is not None and t - last >= 1.0:
            return last + BLOCK_S
    return None


# ---------------------------------------------------------------- the aiortc caller (the floor)


async def aiortc_call(url: str, address: str, timeline: Timeline) -> tuple[list[BargeIn], dict]:
    import aiohttp

    from bench.webrtc_callers import offer_and_connect
    from devtools.caller_peer import CallerPeer, Mic
    from duplex_agent.webrtc.direct.tracks import PlayoutTrack

    heard: list[tuple[float, float]] = []
    mic = Mic()
    sent: list[float] = []  # when each 20 ms frame of the file was handed to the sender

    def next_frame() -> np.ndarray:
        if mic.busy:
            sent.append(time.perf_counter())
        return mic.next_frame()

    peer = CallerPeer(PlayoutTrack(next_frame),
                      on_frame=lambda s: heard.append((time.perf_counter(), float(np.sqrt(np.mean(s ** 2))))))
    try:
        async with aiohttp.ClientSession() as http:
            await offer_and_connect(peer.pc, address, http, url.rstrip("/"))
        await peer.until(lambda: peer.channel.readyState == "open", 20)
        mic.say(timeline.audio)
        await peer.until(lambda: not mic.busy, timeline.audio.size / RATE + 60)
        # The reply to the last interruption: its transcript arrives after the file ends.
        await peer.until(lambda: len(peer.events_since(0, "conversation.item.input_audio_transcription.completed"))
                         >= 2 * len(timeline.interruptions), 20)
    finally:
        await peer.close()
    lines = [e.get("transcript", "") for e in peer.events_since(0, "conversation.item.input_audio_transcription.completed")]
    if not sent:
        return [], {"error": "the caller never played its file"}
    # Each interruption's onset is the time its frame was handed over (a stalled loop sends late),
    # on the clock of the agent's frames.
    frame_s = 960 / RATE

    def at(file_s: float) -> float:
        index = min(int(file_s / frame_s), len(sent) - 1)
        return sent[index] + (file_s - index * frame_s)

    found = []
    for (_, question_end), onset, line in zip(timeline.questions, timeline.interruptions,
                                              interruption_lines(lines, len(timeline.interruptions)), strict=True):
        into, quiet = measure(heard, at(onset), at(question_end))
        words, first = score_words(line)
        found.append(BargeIn(into, quiet, line, words, first))
    return found, {"user_lines": lines}


# ---------------------------------------------------------------- the run


def summary(found: list[BargeIn]) -> dict[str, float | int | None]:
    quiet = [b.onset_to_quiet_ms for b in found if b.onset_to_quiet_ms is not None]
    return {"n": len(found), "stopped": len(quiet),
            "p50_ms": percentile(quiet, 50) if quiet else None, "p95_ms": percentile(quiet, 95) if quiet else None,
            "words": round(float(np.mean([b.words for b in found])), 2) if found else None,
            "first_words": sum(b.first_words for b in found)}


def caller_name(mode: str, constraints: str) -> str:
    """A browser caller's name in the results: the constraints' in direct mode, ``livekit.`` before them."""
    return constraints if mode == "direct" else f"{mode}.{constraints}"


def run(args: argparse.Namespace) -> dict[str, object]:
    from devtools.speech import write_wav
    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    timeline = build_timeline(args.cycles, args.lead, args.gap)
    work = Path(tempfile.mkdtemp(prefix="browser-bargein-"))
    wav = write_wav(work / "mic.wav", timeline.audio, RATE)
    port = free_port()
    address = interface_ipv4()  # media needs ICE on a real interface
    server, livekit_url = start_loopback_server(work, address)
    worker = Service("worker", [sys.executable, "-m", "duplex_agent.agent.app.cli", "dev", "--host", "127.0.0.1",
                                "--port", str(port), "--ice-address", address,
                                "--plugin", "bench.browser_bargein.StoryPlugin"], work / "worker.log",
                     env={"LIVEKIT_URL": livekit_url})
    worker.start()
    results: dict[str, object] = {}
    try:
        wait_for_metrics(worker, port, 180)
        url = f"http://127.0.0.1:{port}/"
        for mode in args.modes:
            for number, constraints in enumerate(args.constraints):
                name = caller_name(mode, constraints)
                room = None if mode == "direct" else f"bench-{number}"
                found, info = browser_call(url, wav, timeline, CONSTRAINTS[constraints], room)
                results[name] = {"summary": summary(found), "barge_ins": [b.__dict__ for b in found], **info}
                print(json.dumps({name: results[name]}, indent=1), flush=True)
        found, info = asyncio.run(aiortc_call(url, address, timeline))
        results["aiortc"] = {"summary": summary(found), "barge_ins": [b.__dict__ for b in found], **info}
        print(json.dumps({"aiortc": results["aiortc"]}, indent=1), flush=True)
    finally:
        worker.stop()
        server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=3, help="question-and-interruption cycles in each call")
    parser.add_argument("--lead", type=float, default=5.0,
                        help="seconds from a question's last sound to the interruption's first")
    parser.add_argument("--gap", type=float, default=10.0, help="seconds after an interruption before the next question")
    parser.add_argument("--constraints", default="page,aec_ns_agc,ns_agc,none",
                        help=f"comma-separated sets of audio constraints, of {', '.join(CONSTRAINTS)}")
    parser.add_argument("--modes", default="direct,livekit", help="the page's modes: direct, livekit or both")
    parser.add_argument("--quick", action="store_true", help="one cycle, the page's constraints and none")
    args = parser.parse_args()
    if args.quick:
        args.cycles, args.constraints = 1, "page,none"
    args.constraints = [name for name in args.constraints.split(",") if name]
    unknown = [name for name in args.constraints if name not in CONSTRAINTS]
    if unknown:
        parser.error(f"unknown constraints {unknown}: choose from {', '.join(CONSTRAINTS)}")
    args.modes = [mode for mode in args.modes.split(",") if mode]
    if not args.modes or set(args.modes) - {"direct", "livekit"}:
        parser.error(f"--modes takes direct, livekit or both, not {args.modes}")
    report = Report("browser_bargein", quick=args.quick)
    results = run(args)
    floor = results["aiortc"]["summary"]  # type: ignore[index]
    print(f"\n{'caller':<20} {'stopped':>8} {'p50 ms':>8} {'p95 ms':>8} {'words':>6} {'first words':>12}")
    for name, result in results.items():
        s = result["summary"]  # type: ignore[index]
        print(f"{name:<20} {s['stopped']:>3} of {s['n']:<2} {fmt(s['p50_ms']):>8} {fmt(s['p95_ms']):>8} "
              f"{fmt(s['words'], 2):>6} {s['first_words']:>5} of {s['n']}")
        if name == "aiortc":
            continue
        report.add(f"browser.{name}.bargein_p50", f"Chromium caller ({name}): the interruption's onset as the "
                   "fake microphone played it -> the agent quiet at the page, p50", s["p50_ms"],
                   floor=floor["p50_ms"], unit="ms", n=s["stopped"], area="barge-in")
        report.add(f"browser.{name}.bargein_p95", f"Chromium caller ({name}): onset -> the agent quiet, p95",
                   s["p95_ms"], floor=floor["p95_ms"], unit="ms", n=s["stopped"], area="barge-in")
        report.add(f"browser.{name}.words", f"Chromium caller ({name}): the interruption's words the model heard",
                   percent(s["words"]), floor=percent(floor["words"]), unit="%", n=s["n"], area="barge-in")
        report.add(f"browser.{name}.first_words", f"Chromium caller ({name}): interruptions whose first two "
                   "words reached the model", percent(s["first_words"] / s["n"] if s["n"] else None),
                   floor=percent(floor["first_words"] / floor["n"] if floor["n"] else None), unit="%", n=s["n"],
                   area="barge-in")
    report.write()


def percent(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
