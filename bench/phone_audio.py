"""Phone-line callers beside wideband ones, in one run: barge-in, false pauses and what the agent
understood, with the caller's audio as a SIP bridge brings it (8 kHz G.711 mu-law, 300-3400 Hz,
line noise: devtools/livekit_server/sip/phone_line.py) and as a wideband caller's 48 kHz.

Barge-in and false pauses go through the real call path and Silero edge VAD on the audio's own
clock, as bench.false_pauses measures them (its clips, its ``pause`` rule, the agent speaking):
held speech from its onset frame to the agent's first quiet frame, and the sounds, backchannels
and room noise that paused or cancelled the reply. Phone callers get the worker's phone turn
detection (webrtc/media/phone_callers.py), wideband ones the default. What the agent understood
is the reference model's recogniser on spoken questions: the share of their words it heard.
Each phone figure's floor is the same figure for wideband callers in the same run.

Run: python -m bench.phone_audio [--offsets 4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import soxr

from bench.false_pauses import AGENT_TEXT, CAPS, MODES, NOT_SPEECH, RATE, Trial, clip_set, trial
from bench.report import Report
from bench.stats import percentile
from devtools.livekit_server.sip.phone_line import LineDirection
from devtools.speech import speak, words
from duplex_agent.agent.models.vad import SileroVadModel
from duplex_agent.webrtc.media.phone_callers import phone_turn_detection

#: Line noise under a phone caller, dBFS (a quiet line; the loopback's phones use -45 to -50).
LINE_NOISE_DBFS = -50.0
QUESTIONS = (
    "What time does the pharmacy close on Saturday?",
    "I would like to change my appointment to next Tuesday.",
    "Can you send the invoice to my email address?",
    "My order number is four five seven two.",
    "Is the store on Main Street open today?",
    "Please cancel the delivery for tomorrow morning.",
)


def phone_line(audio: np.ndarray) -> np.ndarray:
    """``audio`` (48 kHz) as it arrives from a phone: line noise under it, then the line."""
    rng = np.random.default_rng(7)
    noisy = audio + (10 ** (LINE_NOISE_DBFS / 20) * rng.standard_normal(audio.size)).astype(np.float32)
    out, _ = LineDirection(RATE, RATE).carry(noisy)
    return out


def understood(audio: np.ndarray, text: str) -> float:
    """The share of ``text``'s words the recogniser heard in ``audio`` (48 kHz)."""
    from duplex_agent.plugins.reference.asr import WhisperRecognizer

    heard = set(words(WhisperRecognizer.shared().transcribe(soxr.resample(audio, RATE, 16000).astype(np.float32))))
    said = words(text)
    return sum(word in heard for word in said) / len(said)


async def barge_in(vad: SileroVadModel, offsets: int, line, label: str) -> dict[str, list[Trial]]:
    reply = speak(AGENT_TEXT, CAPS.output_sample_rate)
    reply_ms = 1000.0 * reply.size / CAPS.output_sample_rate
    shifts = [32.0 * k / offsets for k in range(offsets)]
    mode = {**MODES["pause"], "turn_detection": phone_turn_detection()} if line is not None else MODES["pause"]
    trials: dict[str, list[Trial]] = {}
    for group, members in clip_set().items():
        trials[group] = [await trial(vad, reply, reply_ms, clip, shift, mode, line=line)
                         for _, clip in members for shift in shifts]
        print(f"   {label:9} {group:13} paused {sum(t.paused > 0 for t in trials[group])}/{len(trials[group])}, "
              f"resumed {sum(t.resumed > 0 for t in trials[group])}, cancelled "
              f"{sum(t.cancelled for t in trials[group])}", flush=True)
    return trials


def figures(trials: dict[str, list[Trial]]) -> dict[str, tuple[float | None, int]]:
    held = trials["speech"]
    reactions = [t.reaction_ms for t in held if t.cancelled and t.reaction_ms is not None]
    noises = [t for group in NOT_SPEECH for t in trials[group]]
    return {
        "bargein_p50": (percentile(reactions, 50), len(reactions)),
        "bargein_p95": (percentile(reactions, 95), len(reactions)),
        "speech_cancelled": (100 * sum(t.cancelled for t in held) / max(1, len(held)), len(held)),
        "speech_stutter": (100 * sum(t.resumed > 0 for t in held) / max(1, len(held)), len(held)),
        "false_pauses": (float(sum(t.resumed for t in noises)), len(noises)),
        "noise_cancelled": (100 * sum(t.cancelled for t in noises) / max(1, len(noises)), len(noises)),
    }


TITLES = {
    "bargein_p50": ("held speech over the agent, from its first sound to the agent's first quiet frame, p50", "ms"),
    "bargein_p95": ("held speech over the agent, from its first sound to the agent's first quiet frame, p95", "ms"),
    "speech_cancelled": ("held speech over the agent that cancelled its reply (should be all)", "%"),
    "speech_stutter": ("held speech over the agent that paused it, let it go on, then stopped it again", "%"),
    "false_pauses": ("false pauses (the reply paused, then resumed) from knocks, coughs, backchannels and room "
                     "noise", "count"),
    "noise_cancelled": ("knocks, coughs, backchannels and room noise that cancelled the reply", "%"),
    "understood": ("words of spoken questions the agent's recogniser heard", "%"),
}


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


async def run(offsets: int, report: Report) -> None:
    vad = SileroVadModel.shared()
    measured: dict[str, dict[str, tuple[float | None, int]]] = {}
    for label, line in (("wideband", None), ("phone", phone_line)):
        measured[label] = figures(await barge_in(vad, offsets, line, label))
        scores = [understood(line(a) if line else a, q) for q in QUESTIONS for a in [speak(q, RATE, after_ms=300)]]
        measured[label]["understood"] = (100 * float(np.mean(scores)), len(scores))
        print(f"   {label:9} questions understood: {100 * float(np.mean(scores)):.1f} % of their words "
              f"(least {100 * min(scores):.0f} %)", flush=True)
    print("\n== phone beside wideband")
    for name, (title, unit) in TITLES.items():
        phone, n = measured["phone"][name]
        wide, _ = measured["wideband"][name]
        print(f"   {name:17} phone {_shown(phone)}  wideband {_shown(wide)} {unit}")
        report.add(f"phone_audio.{name}", f"phone-line callers: {title}", phone, floor=wide, unit=unit, n=n,
                   area="phone", compare="beyond_floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offsets", type=int, default=4, help="clip offsets against the 32 ms VAD window grid")
    parser.add_argument("--quick", action="store_true", help="2 offsets instead of --offsets")
    args = parser.parse_args()
    print("== phone-line callers beside wideband: barge-in, false pauses, what the agent understood ==", flush=True)
    report = Report("phone_audio", quick=args.quick)
    asyncio.run(run(2 if args.quick else args.offsets, report))
    report.write()


if __name__ == "__main__":
    main()
