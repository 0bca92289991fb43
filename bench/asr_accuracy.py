"""Word error rate and turn latency of each Whisper model the reference model can run.

The clip set: short requests of the kind a caller makes of an agent that acts ("Book a table
for two at seven"), said by Piper's voice and by espeak-ng voices, each clean and through a
phone line (devtools.speech.phone_line: hiss 20 dB below the speech, 300-3400 Hz, mu-law at
8 kHz). Each clip carries the silence a turn has around it in the worker (the VAD's 300 ms
prefix before the speech, a pause after it), so it is transcribed as a turn is.

For each model: the word error rate over the whole set (and over its phone-line half), the
share of requests heard word for word, and the time to transcribe one turn (2-3 s of audio,
in one pass, on one CPU thread as the worker runs it), as wall time and as the process's CPU
time (which a busy machine disturbs less). tiny.en is the floor: the model the reference used
before. With a multilingual model, a few requests in German, French and Spanish (espeak-ng)
are transcribed with the language given, to show what other languages get.

Prints a table per model and voice; never passes or fails.

Run: python -m bench.asr_accuracy [--quick] [--models base,tiny.en]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.report import Report
from bench.stats import percentile
from bench.wer import error_rate, word_errors
from devtools.speech import espeak, phone_line, speak
from duplex_agent.agent.models.model_errors import MissingModelError
from duplex_agent.plugins.reference.asr import ASR_MODELS, WhisperRecognizer

RATE = 16000
BEFORE_MS, AFTER_MS = 300, 300  # the VAD's prefix, and the pause that ends a turn
FLOOR_MODEL = "tiny.en"

REQUESTS = [
    "What is the weather like in Paris today?",
    "Book a table for two at seven.",
    "Transfer me to billing, please.",
    "Can you check the status of my order?",
    "I would like to cancel my appointment on Friday.",
    "How much is a return ticket to Boston?",
    "Please call me back tomorrow morning.",
    "Is there a flight to London after six?",
    "Set a reminder to pay the electricity bill.",
    "What time does the pharmacy close tonight?",
    "Send the invoice to my email address.",
    "Hang up the call now, thank you.",
]
VOICES = ("piper", "en-us", "en-gb+f3", "en-gb-scotland")
LINES = ("clean", "phone")
# (espeak-ng voice, Whisper language code, requests)
OTHER_LANGUAGES = [
    ("de", "de", ["Wie ist das Wetter heute in Paris?", "Ich möchte einen Tisch für zwei Personen reservieren.",
                  "Bitte verbinden Sie mich mit der Buchhaltung.", "Wann schließt die Apotheke heute Abend?"]),
    ("fr", "fr", ["Quel temps fait-il à Paris aujourd'hui?", "Je voudrais réserver une table pour deux personnes.",
                  "Passez-moi le service de facturation, s'il vous plaît.", "À quelle heure ferme la pharmacie?"]),
    ("es", "es", ["¿Qué tiempo hace hoy en París?", "Quiero reservar una mesa para dos personas.",
                  "Páseme con el departamento de facturación, por favor.", "¿A qué hora cierra la farmacia?"]),
]


@dataclass(frozen=True)
class Clip:
    text: str
    voice: str
    line: str
    audio: np.ndarray


@dataclass(frozen=True)
class Heard:
    clip: Clip
    text: str
    wall_ms: float
    cpu_ms: float


def _voice(text: str, voice: str) -> np.ndarray:
    return speak(text, RATE) if voice == "piper" else espeak(text, RATE, voice=voice)


def _turn(speech: np.ndarray) -> np.ndarray:
    pad = lambda ms: np.zeros(RATE * ms // 1000, np.float32)  # noqa: E731
    return np.concatenate([pad(BEFORE_MS), speech, pad(AFTER_MS)])


def clip_set(requests: list[str], voices: tuple[str, ...]) -> list[Clip]:
    clips = []
    for i, text in enumerate(requests):
        for j, voice in enumerate(voices):
            turn = _turn(_voice(text, voice))
            clips.append(Clip(text, voice, "clean", turn))
            clips.append(Clip(text, voice, "phone", phone_line(turn, RATE, seed=100 * i + j)))
    return clips


def transcribe_all(recognizer: WhisperRecognizer, clips: list[Clip]) -> list[Heard]:
    recognizer.transcribe(clips[0].audio)  # the first call pays for allocations
    heard = []
    for clip in clips:
        wall, cpu = time.perf_counter(), time.process_time()
        text = recognizer.transcribe(clip.audio)
        heard.append(Heard(clip, text, 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)))
    return heard


def wer_of(heard: list[Heard]) -> float:
    return 100 * error_rate([(h.clip.text, h.text) for h in heard])


def exact_of(heard: list[Heard]) -> float:
    return 100 * sum(word_errors(h.clip.text, h.text)[0] == 0 for h in heard) / len(heard) if heard else float("nan")


def print_model(name: str, heard: list[Heard], load_s: float) -> None:
    print(f"\n== Whisper {name} (loaded in {load_s:.1f} s)")
    print(f"   {'voice':<16}{'clean WER':>10}{'phone WER':>10}")
    for voice in dict.fromkeys(h.clip.voice for h in heard):
        cells = [wer_of([h for h in heard if h.clip.voice == voice and h.clip.line == line]) for line in LINES]
        print(f"   {voice:<16}" + "".join(f"{c:>9.1f}%" for c in cells))
    print(f"   all: WER {wer_of(heard):.1f} %, requests heard word for word {exact_of(heard):.0f} %; "
          f"one turn: wall p50 {statistics.median(h.wall_ms for h in heard):.0f} ms, "
          f"p95 {percentile([h.wall_ms for h in heard], 95):.0f} ms, "
          f"CPU p50 {statistics.median(h.cpu_ms for h in heard):.0f} ms")
    wrong = [h for h in heard if word_errors(h.clip.text, h.text)[0]]
    for h in wrong[:8]:
        print(f"   {h.clip.voice}/{h.clip.line}: {h.clip.text!r} -> {h.text!r}")
    if len(wrong) > 8:
        print(f"   ... and {len(wrong) - 8} more misheard")


def other_languages(model: str, quick: bool) -> dict[str, float]:
    """WER per language code, the language given to Whisper."""
    rates = {}
    for voice, language, requests in OTHER_LANGUAGES:
        recognizer = WhisperRecognizer.shared(model, language)
        pairs = [(text, recognizer.transcribe(_turn(espeak(text, RATE, voice=voice))))
                 for text in requests[: 2 if quick else None]]
        rates[language] = 100 * error_rate(pairs)
        print(f"   {language}: WER {rates[language]:.1f} %  " + "; ".join(f"{t!r} -> {h!r}" for t, h in pairs[:2]))
    return rates


def add_model(report: Report, model: str, heard: list[Heard], base: list[Heard] | None, beside: str, turn: str,
              *, voices: int) -> None:
    """The model's figures, each beside tiny.en's on the same clips (``base``) where it is not tiny.en."""
    def line(hs: list[Heard], name: str) -> list[Heard]:
        return [h for h in hs if h.clip.line == name]

    def both(figure: str, title: str, measure: Callable[[list[Heard]], float],
             pick: Callable[[list[Heard]], list[Heard]] = list, **kwargs: Any) -> None:
        report.add(f"asr.{model}.{figure}", title + beside, measure(pick(heard)),
                   floor=None if base is None else measure(pick(base)), n=len(pick(heard)), area="models", **kwargs)

    both("wer", f"ASR word error rate, Whisper {model}, {voices} voices, clean and through a phone line", wer_of,
         unit="%", digits=1)
    both("wer_clean", f"ASR word error rate, clean, Whisper {model}", wer_of, lambda hs: line(hs, "clean"),
         unit="%", digits=1)
    both("wer_phone", f"ASR word error rate through a phone line, Whisper {model}", wer_of,
         lambda hs: line(hs, "phone"), unit="%", digits=1)
    both("exact", f"requests heard word for word, Whisper {model}", exact_of, unit="%", digits=1)
    both("turn_p50", f"{turn}, Whisper {model}, wall p50", lambda hs: statistics.median(h.wall_ms for h in hs),
         unit="ms", compare="ratio", digits=2)
    both("turn_cpu_p50", f"{turn}, Whisper {model}, CPU time p50", lambda hs: statistics.median(h.cpu_ms for h in hs),
         unit="ms", compare="ratio", digits=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.asr_accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"4 requests in 2 voices ({4 * 2 * len(LINES)} clips) instead of "
                             f"{len(REQUESTS)} in {len(VOICES)} ({len(REQUESTS) * len(VOICES) * len(LINES)})")
    parser.add_argument("--models", default=",".join(ASR_MODELS), help="comma-separated, of " + ", ".join(ASR_MODELS))
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    requests, voices = (REQUESTS[:4], VOICES[::2]) if args.quick else (REQUESTS, VOICES)
    report = Report("asr_accuracy", quick=args.quick)
    print(f"== the clip set: {len(requests)} requests x {len(voices)} voices x {len(LINES)} lines", flush=True)
    clips = clip_set(requests, voices)
    lengths = [c.audio.size / RATE for c in clips]
    print(f"   {len(clips)} clips, {min(lengths):.1f}-{max(lengths):.1f} s (p50 {statistics.median(lengths):.1f} s) "
          f"with their silence", flush=True)

    results: dict[str, list[Heard]] = {}
    languages: dict[str, dict[str, float]] = {}
    for model in models:
        started = time.perf_counter()
        try:
            recognizer = WhisperRecognizer.shared(model)
        except MissingModelError as error:
            print(f"\n== Whisper {model}: skipped: {error}", flush=True)
            continue
        load_s = time.perf_counter() - started
        results[model] = transcribe_all(recognizer, clips)
        print_model(model, results[model], load_s)
        if not model.endswith(".en"):
            print(f"   other languages, {model}, the language given:")
            languages[model] = other_languages(model, args.quick)

    floor = results.get(FLOOR_MODEL)
    turn = f"one turn of {statistics.median(lengths):.1f} s (p50) transcribed on one thread"
    for model, heard in results.items():
        base = None if model == FLOOR_MODEL else floor
        beside = "" if base is None else f"; floor: {FLOOR_MODEL}"
        add_model(report, model, heard, base, beside, turn, voices=len(voices))
        for language, rate in languages.get(model, {}).items():
            count = sum(len(r[: 2 if args.quick else None]) for _, code, r in OTHER_LANGUAGES if code == language)
            report.add(f"asr.{model}.wer_{language}", f"ASR word error rate in {language} (espeak-ng, clean, the "
                       f"language given), Whisper {model}", rate, unit="%", n=count, area="models", digits=1)
    if not results:
        print("no model could be loaded", file=sys.stderr)
        return 1
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
