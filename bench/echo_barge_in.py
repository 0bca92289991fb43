"""Echo on a speakerphone caller: does the agent interrupt itself on its own voice, and does a real
barge-in still stop it? With the worker's echo canceller and without, over the same calls.

Each scenario is one call (the call path in process, real Silero, paced frame by frame:
tests/support/speakerphone.py): the agent's spoken replies go out, come back through a room
(tests/support/echo.py: delay, room response, level under what was played) into the caller's
microphone. First ``--replies`` replies the caller does not talk over (each one cut is a
self-interruption; pauses that resumed are false pauses), then ``--barge-ins`` replies the caller
interrupts at a different point each: onset-to-quiet (the interruption's first sound in the
microphone -> the first silent frame of the agent's, 20 ms steps) and how much of the
interruption's first half second the model got (dB over what was said: a canceller that swallows
the caller's words shows here).

Scenarios: no echo (a headset), speakerphones at -10 and -25 dB with 50-250 ms of delay, echo louder
than the caller (-3 dB), echo 500 ms late, a path that changes at every reply (delay, room and
level), a phone line's residual echo (-30 dB, 8 kHz band), and barge-ins on a new call's first
reply (with a headset and with a speakerphone: the canceller has heard nothing of the agent yet).

Run: python -m bench.echo_barge_in [--replies 20] [--barge-ins 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from dataclasses import dataclass

import numpy as np
import soxr

from bench.report import Report
from bench.stats import percentile, summary

REPLY = ("I would like to tell you about the weather in the mountains this weekend, and whether the trails "
         "are open for hiking with your family and your two dogs.")
INTERRUPTION = "Stop, please wait a moment. I have another question."
OPTIONS = {"none": False, "apm": True}


@dataclass(frozen=True)
class Scenario:
    name: str
    delay_ms: float | None  # None: no echo
    level_db: float = -10.0
    moving: bool = False  # the path changes at every reply
    phone: bool = False  # band-limited to a phone line's 8 kHz
    fresh: bool = False  # each barge-in on a new call's first reply (the canceller has heard nothing yet)


SCENARIOS = (
    Scenario("headset", None),
    Scenario("headset first reply", None, fresh=True),
    Scenario("speaker -10 dB 150 ms first reply", 150.0, -10.0, fresh=True),
    Scenario("speaker -10 dB 150 ms", 150.0, -10.0),
    Scenario("speaker -10 dB 250 ms", 250.0, -10.0),
    Scenario("speaker -25 dB 50 ms", 50.0, -25.0),
    Scenario("loud echo -3 dB", 150.0, -3.0),
    Scenario("late echo 500 ms", 500.0, -10.0),
    Scenario("moving path", 80.0, -10.0, moving=True),
    Scenario("phone -30 dB", 120.0, -30.0, phone=True),
)


def phone_band(response: np.ndarray) -> np.ndarray:
    """A room response heard through an 8 kHz phone line (the band above 4 kHz gone)."""
    narrow = soxr.resample(soxr.resample(response, 48000, 8000), 8000, 48000).astype(np.float32)
    return narrow / np.sqrt(np.sum(narrow**2))


def interrupt_point(index: int, barge_ins: int) -> float:
    """Where the ``index``-th of ``barge_ins`` interruptions begins in its reply: 0.3-2.5 s in."""
    return 300.0 + 2200.0 * index / max(1, barge_ins - 1)


async def one_call(scenario: Scenario, cancel: bool, replies: int, barge_ins: int,
                   reply: np.ndarray, interruption: np.ndarray, *, first: int = 0, spread: int = 0) -> dict[str, list[float]]:
    """One call: ``replies`` replies, then ``barge_ins`` interrupted ones (at the ``first``-th of ``spread``
    points on; 0: of ``barge_ins``)."""
    from duplex_agent.agent.models.vad import SileroVadModel
    from duplex_agent.webrtc.media.call_audio import CallAudioPath
    from tests.support.echo import EchoPath, room_response
    from tests.support.speakerphone import ReplyingConversation, SpeakerphoneCall

    room = room_response()
    echo = None
    if scenario.delay_ms is not None:
        echo = EchoPath(delay_ms=scenario.delay_ms, level_db=scenario.level_db,
                        response=phone_band(room) if scenario.phone else room)
    conversation = ReplyingConversation()
    path = CallAudioPath(conversation, vad_model=SileroVadModel.shared(), echo_cancel=cancel)
    await path.start()
    call = SpeakerphoneCall(path, conversation, echo)
    figures: dict[str, list[float]] = {"self": [], "false_pauses": [], "quiet": [], "missed": [], "cut_first": [], "kept": []}
    try:
        for index in range(replies + barge_ins):
            if scenario.moving and echo is not None:
                echo.change(delay_ms=(80.0, 220.0, 140.0)[index % 3], level_db=(-10.0, -6.0, -14.0)[index % 3],
                            response=room_response(seed=index + 1))
            if index < replies:
                heard = await call.reply(reply, 24000)
                figures["self"].append(float(heard.cancelled))
            else:
                at = interrupt_point(first + index - replies, spread or barge_ins)
                heard = await call.reply(reply, 24000, interruption=interruption, interrupt_after_ms=at)
                if heard.cancelled and heard.kept_db is None:  # its echo cut it before the caller spoke
                    figures["cut_first"].append(1.0)
                elif heard.onset_to_quiet_ms is None:
                    figures["missed"].append(1.0)
                else:
                    figures["quiet"].append(heard.onset_to_quiet_ms)
                if heard.kept_db is not None:
                    figures["kept"].append(heard.kept_db)
            figures["false_pauses"].append(float(heard.false_pauses))
    finally:
        await path.close()
    return figures


def fresh_calls(scenario: Scenario, cancel: bool, barge_ins: int, reply: np.ndarray,
                interruption: np.ndarray) -> dict[str, list[float]]:
    """``barge_ins`` new calls, each interrupted in its first reply."""
    figures: dict[str, list[float]] = {}
    for index in range(barge_ins):
        one = asyncio.run(one_call(scenario, cancel, 0, 1, reply, interruption, first=index, spread=barge_ins))
        for name, values in one.items():
            figures.setdefault(name, []).extend(values)
    return figures


def add_figures(report: Report, scenario: Scenario, ours: dict[str, list[float]], floor: dict[str, list[float]],
                barge_ins: int) -> None:
    """The scenario's figures with the worker's echo canceller, beside the same call without it."""
    key = "echo." + re.sub(r"[^a-z0-9]+", "_", scenario.name.lower()).strip("_")
    where = f"{scenario.name}; floor: no echo canceller"
    if ours["self"]:
        report.add(f"{key}.self_interruptions", f"replies the agent's own echo cut, of {len(ours['self'])} ({where})",
                   sum(ours["self"]), floor=sum(floor["self"]), unit="replies", n=len(ours["self"]), area="barge-in")
    report.add(f"{key}.false_pauses", f"false pauses over {len(ours['false_pauses'])} replies ({where})",
               sum(ours["false_pauses"]), floor=sum(floor["false_pauses"]), unit="pauses",
               n=len(ours["false_pauses"]), area="barge-in")
    for q in (50, 95):
        report.add(f"{key}.bargein_p{q}", f"barge-in onset-to-quiet p{q} ({where})",
                   percentile(ours["quiet"], q), floor=percentile(floor["quiet"], q), unit="ms",
                   n=len(ours["quiet"]), area="barge-in")
    report.add(f"{key}.cut_before_bargein", f"replies the echo cut before the caller interrupted, of {barge_ins} "
               f"({where})", sum(ours["cut_first"]), floor=sum(floor["cut_first"]), unit="replies", n=barge_ins,
               area="barge-in")
    report.add(f"{key}.bargein_missed", f"barge-ins that did not stop the agent, of {barge_ins} ({where})",
               sum(ours["missed"]), floor=sum(floor["missed"]), unit="barge-ins", n=barge_ins, area="barge-in")
    report.add(f"{key}.interruption_kept_p50", "the interruption's first 0.5 s as the model got it, p50, dB over "
               f"what was said ({where})", percentile(ours["kept"], 50), floor=percentile(floor["kept"], 50),
               unit="dB", n=len(ours["kept"]), area="barge-in")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.echo_barge_in", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replies", type=int, default=20, help="replies the caller does not talk over, per call")
    parser.add_argument("--barge-ins", type=int, default=8, help="replies the caller interrupts, per call")
    parser.add_argument("--quick", action="store_true", help="5 replies and 4 barge-ins per call")
    args = parser.parse_args(argv)
    if args.quick:
        args.replies, args.barge_ins = 5, 4
    from devtools.speech import speak

    reply = speak(REPLY, 24000)
    # A different voice's level: the caller a little quieter than the agent's reply.
    interruption = 0.7 * speak(INTERRUPTION, 48000)
    report = Report("echo_barge_in", quick=args.quick)
    print(f"echo on a speakerphone caller: {args.replies} replies + {args.barge_ins} barge-ins per call", flush=True)
    for scenario in SCENARIOS:
        runs = {option: fresh_calls(scenario, cancel, args.barge_ins, reply, interruption) if scenario.fresh
                else asyncio.run(one_call(scenario, cancel, args.replies, args.barge_ins, reply, interruption))
                for option, cancel in OPTIONS.items()}
        for option, f in runs.items():
            print(f"{scenario.name:24} {option:5} self-interruptions {int(sum(f['self']))}/{len(f['self'])}, "
                  f"false pauses {int(sum(f['false_pauses']))}, barge-in onset-to-quiet "
                  f"{summary(f['quiet'], 'ms', digits=0)}, missed {int(sum(f['missed']))}/{args.barge_ins} "
                  f"(cut by the echo first: {int(sum(f['cut_first']))}), "
                  f"interruption kept {summary(f['kept'], 'dB', digits=1)}", flush=True)
        add_figures(report, scenario, runs["apm"], runs["none"], args.barge_ins)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
