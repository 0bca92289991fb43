"""Answering-machine detection on outbound calls: a person or a voicemail box, and how soon.

The bench makes its clip set (``devtools.phone_greetings``): people's short greetings in Piper's
voice over three levels of line noise, and espeak-ng voicemail greetings of 3-15 s in four voices
followed by a 1 kHz beep, all through the modelled phone line (8 kHz, 300-3400 Hz, mu-law). Each
clip goes to ``AnsweringMachineDetector`` in 20 ms frames, as a call's audio arrives.

Figures: the share decided right; the decision time from the greeting's first word, p50 and p95
(the goal: 95 % right within 3 s); for machines, how far from the beep's end the detector put the
end of the greeting (where a message would start). The floor of the time figures is zero: a
detector that knew at the first word. Time is the audio's own, so the figures do not depend on the
machine's load.

Run: python -m bench.answering_machine [--quick]
"""

from __future__ import annotations

import argparse

from bench.report import Report
from bench.stats import percentile
from devtools.phone_greetings import Greeting, greeting_set
from duplex_agent.agent.telephony.amd import FRAME, AnsweringMachineDetector, Verdict


def run(clip: Greeting) -> AnsweringMachineDetector:
    detector = AnsweringMachineDetector()
    for start in range(0, clip.audio.size, FRAME):
        detector.push(clip.audio[start:start + FRAME])
        if detector.decision is not None and (not clip.machine or detector.greeting_over_at_s is not None):
            break
    return detector


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.answering_machine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the same set: it takes seconds")
    args = parser.parse_args(argv)
    clips = greeting_set()
    right, times_ms, beep_errors_ms = 0, [], []
    for clip in clips:
        detector = run(clip)
        decision = detector.decision
        correct = decision is not None and (decision.verdict is Verdict.MACHINE) == clip.machine
        right += correct
        if decision is not None:
            times_ms.append(1000 * (decision.at_s - clip.starts_at_s))
        if clip.machine and clip.beep_ends_at_s is not None and detector.greeting_over_at_s is not None:
            beep_errors_ms.append(1000 * abs(detector.greeting_over_at_s - clip.beep_ends_at_s))
        print(f"{'ok ' if correct else 'BAD'} {clip.name}: "
              f"{decision.verdict.value if decision else 'undecided'} after "
              f"{(decision.at_s - clip.starts_at_s) if decision else float('nan'):.2f} s"
              f"{f' ({decision.reason})' if decision else ''}")
    humans = sum(not c.machine for c in clips)
    report = Report("answering_machine", quick=args.quick)
    report.add("amd.accuracy", f"answering-machine detection: share of {len(clips)} answered calls told right "
               f"({humans} people's greetings over line noise, {len(clips) - humans} voicemail greetings of "
               "3-15 s with a beep), goal 95 %", 100.0 * right / len(clips), unit="%", n=len(clips), floor=100.0,
               area="telephony")
    for q in (50, 95):
        report.add(f"amd.decision_p{q}", f"answering-machine detection: time from the greeting's first word to the "
                   f"decision, p{q} (goal: within 3 s)", percentile(times_ms, q), unit="ms", n=len(times_ms),
                   floor=0.0, area="telephony")
    report.add("amd.beep_end_error_p95", "voicemail: how far from the end of the beep the detector put the end of "
               "the greeting (where a message starts), p95", percentile(beep_errors_ms, 95) if beep_errors_ms else None,
               unit="ms", n=len(beep_errors_ms), floor=0.0, area="telephony")
    path = report.write()
    print(f"{right}/{len(clips)} right; decision p50 {percentile(times_ms, 50):.0f} ms, "
          f"p95 {percentile(times_ms, 95):.0f} ms; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
