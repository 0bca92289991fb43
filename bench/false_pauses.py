"""False pauses: coughs, knocks, short vocal bursts and backchannels played over the agent.

Each clip is played over a reply of Piper speech through the real call path (CallAudioPath,
PlayoutQueue, the real Silero edge VAD), at 4 offsets against the VAD's 32 ms window grid,
in five modes in the same run:

- ``pause``: the edge pauses at the first rise in the caller's level (a 10 ms block over -40 dBFS,
  15 dB over the caller's background: level_onset.py) or the first window over the pause
  threshold (0.3, under the session VAD's 0.5), then cancels once the speech holds (the session
  VAD's minimum speech, 100 ms) or resumes;
- ``VAD only``: the same without the level rule (the rule before it);
- ``pause@.5``: the same as ``VAD only`` with the pause at the session VAD's threshold;
- ``no pause``: the same confirm rule with pausing off (``NoPauseCallAudioPath``);
- ``before``: the edge rule before the pause: no pause, cancel at the first window (32 ms).

Time is the audio's: one caller frame in and one agent frame out per 20 ms step, as the
transports pace it, so the figures are the worker's reaction without a transport (no
network, no caller jitter buffer) and do not depend on the machine's load. Per clip: how
many trials paused, resumed, cancelled; the pause as the caller heard it (the playout's own
count, fade-out to fade-in) and from the clip's onset frame to the frame the reply came back
in; what a resumed reply skipped (its ack against its length). Then held speech (a sentence and
the other benches' four interruptions, and interruptions no test uses in espeak-ng's voices): onset
frame to the first quiet frame, and to the frame the agent went quiet for good (a pause the sound
let go of lets the agent out between the word's sounds, and the caller hears it stop only at the
next pause). Then continuous noise (bad input): bursts all through a reply.

``--opus`` sends the caller's track through libopus first (32 kbit/s, as a WebRTC caller's
arrives): Opus lets a short sound ring on for ~100 ms, 40-60 dB down, and Silero scores that
tail, and the silence after it, as speech. The VAD counts a window as speech only within 30 dB
of its onset's loudest and scores windows under -70 dBFS 0 (``SPEECH_LEVEL_SPAN_DB``,
``SILENCE_DBFS``); docs/performance.md says why.

Run: python -m bench.false_pauses [--offsets 4] [--opus]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

import numpy as np

from bench.call_rig import OTHER_VOICES, OTHER_WORDS, other_voice
from bench.livekit_callers import INTERRUPTIONS
from bench.report import Report
from bench.stats import percentile, spread
from devtools.rtp_stream import through_opus
from devtools.speech import speak, vocal_burst
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.agent.protocol.events import (
    ClientEvent,
    PlaybackAck,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
)
from duplex_agent.agent.session.ports import Conversation
from duplex_agent.plugins.contract import DuplexCapabilities
from duplex_agent.webrtc.media.barge_in import BargeInRules
from duplex_agent.webrtc.media.call_audio import CallAudioPath
from duplex_agent.webrtc.media.playout import FRAME_SAMPLES

RATE = 48000
FRAME_MS = 20.0
AGENT_TEXT = "The ship sailed on across the grey sea while the crew sang the old songs of home."
LEAD_MS = 600.0  # the reply plays this long before the clip
CAPS = DuplexCapabilities(plugin_id="bench", input_sample_rate=16000, unit_samples=1600,
                          output_sample_rate=22050, max_sessions=1)
#: The clip groups other than held speech: the pauses they make that resume are the false pauses.
NOT_SPEECH = ("sounds", "backchannels", "background")
MODES = {"pause": {"pause_on_onset": True}, "VAD only": {"pause_on_onset": True, "pause_on_level": False},
         "pause@.5": {"pause_on_onset": True, "pause_on_level": False, "barge_in_pause_threshold": 0.5},
         "no pause": {"pause_on_onset": False},
         "before": {"pause_on_onset": False, "barge_in_min_speech_ms": 32.0}}


class NoPauseCallAudioPath(CallAudioPath):
    """The call path with pausing off (the modes' ``pause_on_onset: False``): no pause, the cancel
    waits for the minimum speech."""

    def _barge_in_rules(self) -> BargeInRules:
        return replace(super()._barge_in_rules(), pause=False)


# ---------------------------------------------------------------- the clips

_rng = np.random.default_rng(23)


SPEECH_ONSET_RMS = 0.01  # -40 dBFS over 5 ms: where the caller's sound starts, as the callers stamp it


def acoustic_onset(samples: np.ndarray, rate: int = 48000) -> int:
    """Index of the first 5 ms block whose RMS passes SPEECH_ONSET_RMS."""
    block = rate // 200
    for start in range(0, samples.size - block, block):
        if float(np.sqrt(np.mean(samples[start : start + block] ** 2))) > SPEECH_ONSET_RMS:
            return start
    return 0


def _envelope(n: int, attack_s: float, decay_s: float) -> np.ndarray:
    t = np.arange(n) / RATE
    return np.minimum(1.0, t / attack_s) * np.exp(-t / decay_s)


def knock(ms: float) -> np.ndarray:
    """A knock on a table: a 180 Hz thud decaying in 15 ms under a click of noise."""
    n = int(RATE * ms / 1000)
    t = np.arange(n) / RATE
    thud = np.sin(2 * np.pi * 180 * t) * np.exp(-t / 0.015)
    click = _rng.standard_normal(n) * _envelope(n, 0.0005, 0.004)
    return (0.6 * (0.7 * thud + 0.3 * click)).astype(np.float32)


def noise_cough(ms: float) -> np.ndarray:
    """An unvoiced cough: noise shaped into two broad formants, a fast attack and a decay."""
    n = int(RATE * ms / 1000)
    spectrum = np.fft.rfft(_rng.standard_normal(n))
    hz = np.fft.rfftfreq(n, 1 / RATE)
    spectrum *= np.exp(-(((hz - 700) / 500) ** 2)) + 0.5 * np.exp(-(((hz - 1800) / 700) ** 2))
    shaped = np.fft.irfft(spectrum, n)
    return (0.5 * shaped / np.abs(shaped).max() * _envelope(n, 0.01, ms / 3000)).astype(np.float32)


def room_noise(seconds: float, dbfs: float) -> np.ndarray:
    """Steady room noise (a fan, traffic): noise falling 6 dB an octave, at ``dbfs`` RMS."""
    n = int(RATE * seconds)
    spectrum = np.fft.rfft(_rng.standard_normal(n))
    spectrum[1:] /= np.sqrt(np.fft.rfftfreq(n, 1 / RATE)[1:] / 100.0)
    noise = np.fft.irfft(spectrum, n)
    return (noise * 10 ** (dbfs / 20) / np.sqrt(np.mean(noise ** 2))).astype(np.float32)


def clip_set() -> dict[str, list[tuple[str, np.ndarray]]]:
    return {
        "sounds": [("knock 40 ms", knock(40)), ("knock 80 ms", knock(80)),
                   ("cough (noise) 150 ms", noise_cough(150)), ("cough (noise) 250 ms", noise_cough(250)),
                   *((f"vocal burst {ms} ms", vocal_burst(ms)) for ms in (40, 48, 64, 80))],
        "backchannels": [(f'"{text}" (Piper)', speak(text, RATE)) for text in ("mm-hm", "yeah", "uh huh", "okay")],
        "background": [(f"room noise 2 s, {dbfs} dBFS", room_noise(2.0, dbfs)) for dbfs in (-50, -40, -30)],
        "speech": [(f'"{text}" (Piper)', speak(text, RATE)) for text in ("Hold on, wait a moment please.", *INTERRUPTIONS)],
        "speech, other voices": other_voices(),
    }


def other_voices() -> list[tuple[str, np.ndarray]]:
    """OTHER_WORDS in OTHER_VOICES (espeak-ng; none where it is not installed), at a caller's level."""
    try:
        return [(f'"{text}" ({voice})', other_voice(text, voice, RATE))
                for voice in OTHER_VOICES for text in OTHER_WORDS]
    except FileNotFoundError as exc:
        print(f"(no held speech in other voices: {exc})")
        return []


def continuous_noise(seconds: float = 3.0, every_ms: float = 160.0) -> np.ndarray:
    """Bad input: a 48 ms vocal burst every ``every_ms``, all through the reply."""
    period = np.zeros(int(RATE * every_ms / 1000), np.float32)
    burst = vocal_burst(48)
    period[: burst.size] = burst
    return np.tile(period, int(seconds * 1000 / every_ms))


# ---------------------------------------------------------------- one trial


class ReplyConversation(Conversation):
    """One reply of agent speech, queued at once; records what the call path sends."""

    session_id = "bench"
    capabilities = CAPS
    _ids = itertools.count(1)

    def __init__(self, reply: np.ndarray) -> None:
        self.sent: list[ClientEvent] = []
        self._events: asyncio.Queue[ServerEvent] = asyncio.Queue()
        self.response_id = f"reply-{next(self._ids)}"
        self._events.put_nowait(ResponseCreated(response_id=self.response_id, item_id="i"))
        step = CAPS.output_sample_rate // 10
        for start in range(0, reply.size, step):
            chunk = reply[start : start + step]
            self._events.put_nowait(ResponseAudioDelta(
                response_id=self.response_id, item_id="i", audio=chunk, sample_rate=CAPS.output_sample_rate,
                audio_start_ms=1000.0 * start / CAPS.output_sample_rate, audio_ms=1000.0 * chunk.size / CAPS.output_sample_rate))
        self._events.put_nowait(ResponseAudioDone(response_id=self.response_id, item_id="i"))
        self._events.put_nowait(ResponseDone(response_id=self.response_id, status="completed"))

    def send(self, event: ClientEvent) -> None:
        self.sent.append(event)

    async def events(self) -> AsyncIterator[ServerEvent]:
        while True:
            yield await self._events.get()

    @property
    def queued(self) -> int:
        return self._events.qsize()

    async def close(self, reason: str = "client_closed") -> None:
        pass


@dataclass
class Trial:
    paused: int = 0
    resumed: int = 0
    withheld: int = 0
    cancelled: bool = False
    gaps_ms: list[float] = field(default_factory=list)  # each pause as heard: fade-out to fade-in
    onset_to_resume_ms: float | None = None  # the clip's onset frame to the frame the reply came back in
    reaction_ms: float | None = None  # the clip's onset frame to the first frame the agent went quiet in
    quiet_for_good_ms: float | None = None  # of a cancelled reply: the onset frame to its last pause's frame
    skipped_ms: float | None = None  # of a reply not cancelled: its length less what was played


async def trial(vad: SileroVadModel, reply: np.ndarray, reply_ms: float, clip: np.ndarray, offset_ms: float,
                mode: dict, *, opus: bool = False, line: Callable[[np.ndarray], np.ndarray] | None = None) -> Trial:
    conversation = ReplyConversation(reply)
    options = dict(mode)
    make_path = CallAudioPath if options.pop("pause_on_onset") else NoPauseCallAudioPath
    path = make_path(conversation, vad_model=vad, **options)
    await path.start()
    while conversation.queued:  # the reply is in the playout before the first frame
        await asyncio.sleep(0)
    lead = np.full(int(RATE * (LEAD_MS + offset_ms) / 1000), 1e-4, np.float32)
    caller = np.concatenate([lead, clip])
    if opus:
        caller = through_opus(caller)
    if line is not None:  # the caller's whole track through a phone line, as a SIP bridge brings it
        caller = line(caller)
    onset_frame = (lead.size + acoustic_onset(caller[lead.size:])) // FRAME_SAMPLES  # Opus delays it ~6.5 ms
    result = Trial()
    step = 0
    quiet_since: int | None = None
    while path.playout.playing or path.playout.paused or step * FRAME_SAMPLES < caller.size:
        frame = caller[step * FRAME_SAMPLES : (step + 1) * FRAME_SAMPLES]
        acted, resumed = path.pauses + path.barge_ins, path.false_pauses
        path.push_caller_frame(np.pad(frame, (0, FRAME_SAMPLES - frame.size), constant_values=1e-4), RATE)
        # what this push decided goes out in this step's frame
        if path.pauses + path.barge_ins > acted:
            if result.reaction_ms is None:
                result.reaction_ms = FRAME_MS * (step - onset_frame)
            if quiet_since is None:  # quiet from here, unless a resume lets the agent out again
                quiet_since = step
        if path.false_pauses > resumed:
            quiet_since = None
            if result.onset_to_resume_ms is None:
                result.onset_to_resume_ms = FRAME_MS * (step - onset_frame)
        path.next_frame()
        step += 1
    result.paused, result.resumed, result.withheld = path.pauses, path.false_pauses, path.pauses_withheld
    result.cancelled = any(isinstance(e, ResponseCancel) for e in conversation.sent)
    if result.cancelled and quiet_since is not None:
        result.quiet_for_good_ms = FRAME_MS * (quiet_since - onset_frame)
    result.gaps_ms = path.figures.recent("false_pause_ms")
    if not result.cancelled:
        ack = next(e for e in conversation.sent if isinstance(e, PlaybackAck))
        result.skipped_ms = reply_ms - ack.played_ms
    await path.close()
    return result


# ---------------------------------------------------------------- the run


def _share(trials: list[Trial]) -> str:
    return f"{sum(t.cancelled for t in trials)}/{len(trials)}"


async def run(offsets: int, opus: bool, report: Report) -> None:
    vad = SileroVadModel.shared()
    reply = speak(AGENT_TEXT, CAPS.output_sample_rate)
    reply_ms = 1000.0 * reply.size / CAPS.output_sample_rate
    clips = clip_set()
    shifts = [32.0 * k / offsets for k in range(offsets)]
    print(f"agent reply {reply_ms:.0f} ms of Piper speech; each clip {LEAD_MS:.0f} ms into it, at offsets "
          f"{', '.join(f'{s:.0f}' for s in shifts)} ms against the 32 ms VAD windows; modes: {', '.join(MODES)}; "
          f"caller's track {'through Opus' if opus else 'as PCM'}")
    totals: dict[str, dict[str, list[Trial]]] = {group: {m: [] for m in MODES} for group in clips}
    for group, members in clips.items():
        print(f"\n-- {group}")
        for name, clip in members:
            for mode_name, mode in MODES.items():
                trials = [await trial(vad, reply, reply_ms, clip, s, mode, opus=opus) for s in shifts]
                totals[group][mode_name] += trials
                gaps = [g for t in trials for g in t.gaps_ms]
                back = [t.onset_to_resume_ms for t in trials if t.onset_to_resume_ms is not None]
                skipped = [t.skipped_ms for t in trials if t.skipped_ms is not None]
                line = (f"   {name:34} {mode_name:8}  paused {sum(t.paused > 0 for t in trials)}/{len(trials)}, "
                        f"resumed {sum(t.resumed > 0 for t in trials)}, cancelled {_share(trials)}")
                if gaps:
                    line += f"; pause heard max {max(gaps):.0f} ms, onset->back max {max(back):.0f} ms"
                if skipped:
                    line += f"; skipped max {max(skipped):.1f} ms"
                print(line, flush=True)
    print("\n== summary (share of trials that cancelled the reply; the pause as the caller heard it)")
    for group in NOT_SPEECH:
        print(f"   {group:13} " + ", ".join(f"{m} {_share(totals[group][m])}" for m in MODES))
    for mode_name in ("pause", "VAD only", "pause@.5"):
        paused = [t for group in NOT_SPEECH for t in totals[group][mode_name]]
        gaps = [g for t in paused for g in t.gaps_ms]
        back = [t.onset_to_resume_ms for t in paused if t.onset_to_resume_ms is not None]
        print(f"   {mode_name:8} false pauses: {sum(t.resumed for t in paused)} in {len(paused)} trials "
              f"(background {sum(t.resumed for t in totals['background'][mode_name])}); pause heard {spread(gaps)}; "
              f"clip onset frame -> reply back {spread(back)}; within 300 ms: {sum(b <= 300 for b in back)}/{len(back)}")
        print(f"   {mode_name:8} skipped in resumed replies: max "
              f"{max([t.skipped_ms or 0.0 for t in paused], default=0.0):.1f} ms")
        if mode_name == "pause":  # the worker's rule
            # Backchannels are speech: whether they should cancel is the overlap policy's call, so apart.
            noises = [t for group in ("sounds", "background") for t in totals[group][mode_name]]
            backchannels = totals["backchannels"][mode_name]
            report.add("false_pauses.cancelled", f"knocks, coughs, short grunts and room noise over the agent that "
                       f"cancelled its reply{' (through Opus)' if opus else ''}",
                       100 * sum(t.cancelled for t in noises) / max(1, len(noises)), unit="%", n=len(noises),
                       area="barge-in")
            report.add("false_pauses.backchannels_cancelled", "backchannels (\"mm-hm\", \"yeah\") over the agent "
                       "that cancelled its reply", 100 * sum(t.cancelled for t in backchannels) / max(1, len(backchannels)),
                       unit="%", n=len(backchannels), area="barge-in")
            report.add("false_pauses.resumed_within_300ms", "false pauses whose reply came back within 300 ms of "
                       "the sound's onset", 100 * sum(b <= 300 for b in back) / len(back) if back else None,
                       unit="%", n=len(back), area="barge-in")
            report.add("false_pauses.pause_heard_p95", "a false pause as the caller hears it (fade-out to "
                       "fade-in), p95", percentile(gaps, 95), unit="ms", n=len(gaps), area="barge-in")
    for mode_name in MODES:
        held = totals["speech"][mode_name] + totals["speech, other voices"][mode_name]
        reactions = [t.reaction_ms for t in held if t.cancelled and t.reaction_ms is not None]
        for_good = [t.quiet_for_good_ms for t in held if t.quiet_for_good_ms is not None]
        stutters = sum(t.resumed > 0 and t.cancelled for t in held)
        print(f"   held speech, {mode_name:8}: cancelled {_share(held)}; onset frame -> first quiet frame "
              f"{spread(reactions)}; -> quiet for good {spread(for_good)}; let the agent out again {stutters}")
        if mode_name == "pause":
            report.add("false_pauses.speech_cancelled", "held speech over the agent that cancelled its reply "
                       "(should be all)", 100 * sum(t.cancelled for t in held) / max(1, len(held)), unit="%",
                       n=len(held), area="barge-in")
            report.add("false_pauses.speech_stutter", "held speech over the agent that paused it, let it go on, "
                       "then stopped it (Piper's and espeak-ng's voices)", 100 * stutters / max(1, len(held)),
                       unit="%", n=len(held), area="barge-in")
            report.add("false_pauses.speech_quiet_for_good_p95", "held speech: its onset frame to the frame the "
                       "agent went quiet for good, p95; floor: to the first quiet frame", percentile(for_good, 95),
                       floor=percentile(reactions, 95), unit="ms", n=len(for_good), area="barge-in")

    print("\n== bad input: a 48 ms vocal burst every 160 ms for 3 s, over one reply")
    noise = continuous_noise()
    for mode_name, mode in MODES.items():
        trials = [await trial(vad, reply, reply_ms, noise, s, mode, opus=opus) for s in shifts]
        print(f"   {mode_name:8}: pauses {', '.join(str(t.paused) for t in trials)} per reply (bound "
              f"{'3' if mode['pause_on_onset'] else '-'}), withheld {', '.join(str(t.withheld) for t in trials)}; "
              f"cancelled {_share(trials)}; pause heard {spread([g for t in trials for g in t.gaps_ms])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offsets", type=int, default=4, help="clip offsets against the 32 ms VAD window grid")
    parser.add_argument("--opus", action="store_true", help="the caller's track through an Opus encoder and decoder")
    parser.add_argument("--quick", action="store_true", help="2 offsets instead of --offsets")
    args = parser.parse_args()
    print("== false pauses: sounds over the agent through the call path, five edge rules in one run ==", flush=True)
    report = Report("false_pauses", quick=args.quick)
    asyncio.run(run(2 if args.quick else args.offsets, args.opus, report))
    report.write()


if __name__ == "__main__":
    main()
