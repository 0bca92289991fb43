"""The onset stage of barge-in alone: how long after the frame holding the caller's first sound the
edge decides to pause, with the onset detector's offset grid and without it (one grid, as before).

No network and no clock: the benches' own interruptions (Piper speech, ``bench.livekit_callers``)
go through the real onset detector (Silero, 20 ms frames at 48 kHz) and the real barge-in gate,
at random alignments against the VAD's window grid, over an agent that is speaking. A frame is
counted from its arrival: 0 ms is a pause decided on the frame that holds the onset (the -40 dBFS
5 ms block the callers stamp), which is where the bare echo peers stop (``bench.echo_peer``,
``bench.livekit_echo_agent``). Every 20 ms more is one frame the worker waited beyond them. Also
printed: when the held speech confirms the barge-in (the cancel), which the offset grid leaves alone.

``--frame-aligned``: each utterance starts on a frame boundary, as the benches' callers say them,
at the 8 frame phases against the grid (20 ms frames and 32 ms windows meet every 160 ms),
instead of at random sample offsets, as a live caller's onsets fall.

``--frame-ms 20,40``: also the pause with the caller's audio in frames of each size (both
workers read 20 ms frames: the direct path's packets, the LiveKit worker's ``CALLER_FRAME_MS``,
which was 40 for CPU), counted in
ms from the onset sample to the end of the frame the pause is decided on (when the worker has
that frame), beside the LiveKit floor's rule on the same audio: the first 10 ms frame whose level
passes -40 dBFS (``bench.livekit_echo_agent``).

Prints figures per interruption and over all of them; never passes or fails on time.

Run: python -m bench.onset_delay [--alignments 32] [--frame-aligned] [--frame-ms 20,40]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench.stats import percentile


def decisions(audio: np.ndarray, lead: int, *, offset_grid: bool) -> tuple[int, int]:
    """(frames after the onset frame to the pause, to the confirm) for ``audio`` after ``lead`` samples of silence."""
    from bench.livekit_callers import FRAME_SAMPLES, SAMPLE_RATE, acoustic_onset
    from duplex_agent.agent.models.vad import SileroVadModel
    from duplex_agent.webrtc.media.barge_in import BargeInGate, Verdict
    from duplex_agent.webrtc.media.onset import CallerOnsetDetector

    signal = np.concatenate([np.zeros(lead, np.float32), audio])
    onset_frame = (lead + acoustic_onset(audio)) // FRAME_SAMPLES
    detector, gate = CallerOnsetDetector(SileroVadModel.shared()), BargeInGate()
    paused: int | None = None
    for k in range(signal.size // FRAME_SAMPLES):
        frame = signal[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]
        for window in detector.push(frame, SAMPLE_RATE, float(k), half_step=offset_grid):
            verdict = gate.push(window.probability, at=window.arrived_at, agent_playing=True, reply="r",
                                half_step=window.half_step, level_db=window.level_db)
            if verdict is Verdict.PAUSE and paused is None:
                paused = k
            if verdict is Verdict.CONFIRM:
                return (paused if paused is not None else k) - onset_frame, k - onset_frame
    raise RuntimeError("the interruption never confirmed")


def pause_ms(audio: np.ndarray, lead: int, frame_samples: int, pause_at: float, *, by_level: bool) -> float:
    """Onset sample -> the end of the ``frame_samples`` frame the (two-grid) pause is decided on, in
    ms, with windows at or over ``pause_at`` pausing, and a rise in the level too if ``by_level``."""
    from bench.livekit_callers import SAMPLE_RATE, acoustic_onset
    from duplex_agent.agent.models.vad import SileroVadModel
    from duplex_agent.webrtc.media.barge_in import BargeInGate, BargeInRules, Verdict
    from duplex_agent.webrtc.media.level_onset import LevelOnset
    from duplex_agent.webrtc.media.onset import CallerOnsetDetector

    signal = np.concatenate([np.full(lead, 1e-4, np.float32), audio])  # a quiet line's floor, -80 dBFS
    onset = lead + acoustic_onset(audio)
    detector, gate = CallerOnsetDetector(SileroVadModel.shared()), BargeInGate(BargeInRules(pause_threshold=pause_at))
    level = LevelOnset()
    for k in range(signal.size // frame_samples):
        frame = signal[k * frame_samples : (k + 1) * frame_samples]
        verdicts = [gate.push(window.probability, at=window.arrived_at, agent_playing=True, reply="r",
                              half_step=window.half_step, level_db=window.level_db)
                    for window in detector.push(frame, SAMPLE_RATE, float(k), half_step=True)]
        if level.push(frame, SAMPLE_RATE) and by_level:  # after the frame's windows, as the call path does
            verdicts.append(gate.push_level_onset(at=float(k), agent_playing=True, reply="r"))
        if Verdict.PAUSE in verdicts:
            return 1000.0 * ((k + 1) * frame_samples - onset) / SAMPLE_RATE
    raise RuntimeError("the interruption never paused")


def floor_ms(audio: np.ndarray, lead: int) -> float:
    """Onset sample -> the end of the first 10 ms frame over the LiveKit floor's level, in ms."""
    from bench.livekit_callers import SAMPLE_RATE, acoustic_onset
    from bench.livekit_echo_agent import ONSET_RMS

    signal = np.concatenate([np.full(lead, 1e-4, np.float32), audio])
    onset, frame = lead + acoustic_onset(audio), SAMPLE_RATE // 100
    for k in range(signal.size // frame):
        if float(np.sqrt(np.mean(signal[k * frame : (k + 1) * frame] ** 2))) > ONSET_RMS:
            return 1000.0 * ((k + 1) * frame - onset) / SAMPLE_RATE
    raise RuntimeError("the floor never heard the interruption")


def spread_ms(name: str, ms: list[float]) -> str:
    return f"{name} p50 {percentile(ms, 50):3.0f} p95 {percentile(ms, 95):3.0f} mean {float(np.mean(ms)):5.1f} ms"


def line(name: str, frames: list[int]) -> str:
    ms = [20.0 * f for f in frames]
    return spread_ms(name, ms)


def by_frame_size(sizes: list[int], pause_thresholds: list[float], alignments: int) -> None:
    """The pause after the onset sample with caller frames of each size and each pause threshold,
    beside the LiveKit floor."""
    from bench.livekit_callers import INTERRUPTIONS, SAMPLE_RATE
    from devtools.speech import speak

    rng = np.random.default_rng(40)
    floor: list[float] = []
    ours: dict[tuple[bool, float, int], list[float]] = {
        (by_level, at, size): [] for by_level in (False, True) for at in pause_thresholds for size in sizes}
    for text in INTERRUPTIONS:
        audio = speak(text, SAMPLE_RATE)
        for lead in rng.integers(SAMPLE_RATE // 5, SAMPLE_RATE, alignments):
            floor.append(floor_ms(audio, int(lead)))
            for by_level, at, size in ours:
                ours[by_level, at, size].append(
                    pause_ms(audio, int(lead), SAMPLE_RATE * size // 1000, at, by_level=by_level))
    print(f"the pause after the onset sample, to the end of the frame it is decided on ({len(floor)} onsets)")
    print(f"  LiveKit floor (10 ms frames, -40 dBFS): {spread_ms('', floor)}")
    for (by_level, at, size), ms in ours.items():
        beyond = [a - b for a, b in zip(ms, floor)]
        rule = "level rise + two grids" if by_level else "two grids alone      "
        print(f"  {rule}, pause at {at:.2f}, {size} ms frames: {spread_ms('', ms)}; "
              f"beyond the floor {spread_ms('', beyond)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.onset_delay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alignments", type=int, default=32, help="random grid alignments per interruption")
    parser.add_argument("--frame-aligned", action="store_true",
                        help="utterances start on frame boundaries, at the 8 frame phases against the grid")
    parser.add_argument("--frame-ms", default="", help="also the pause with caller frames of these sizes (ms), e.g. 20,40")
    parser.add_argument("--pause-thresholds", default="",
                        help="with --frame-ms: the pause at each of these thresholds (default: the gate's), e.g. 0.5,0.3")
    args = parser.parse_args(argv)

    from bench.livekit_callers import FRAME_SAMPLES, INTERRUPTIONS, SAMPLE_RATE
    from devtools.speech import speak

    rng = np.random.default_rng(23)
    totals: dict[bool, tuple[list[int], list[int]]] = {False: ([], []), True: ([], [])}
    print("the pause and the confirm, after the frame holding the caller's onset (0: where the floors stop)")
    for text in INTERRUPTIONS:
        audio = speak(text, SAMPLE_RATE)
        if args.frame_aligned:
            leads = [FRAME_SAMPLES * (10 + phase) for phase in range(8)]
        else:
            leads = [int(lead) for lead in rng.integers(SAMPLE_RATE // 5, SAMPLE_RATE, args.alignments)]
        for offset_grid in (False, True):
            pauses, confirms = zip(*(decisions(audio, lead, offset_grid=offset_grid) for lead in leads))
            totals[offset_grid][0].extend(pauses)
            totals[offset_grid][1].extend(confirms)
            grids = "two grids" if offset_grid else "one grid "
            print(f"  {text!r:20} {grids}: {line('pause', list(pauses))}; {line('confirm', list(confirms))}")
    for offset_grid in (False, True):
        grids = "two grids" if offset_grid else "one grid "
        pauses, confirms = totals[offset_grid]
        print(f"all ({len(pauses)}) {grids}: {line('pause', pauses)}; {line('confirm', confirms)}")
    if args.frame_ms:
        from duplex_agent.webrtc.media.barge_in import BargeInRules

        thresholds = [float(at) for at in args.pause_thresholds.split(",")] if args.pause_thresholds else [
            BargeInRules().pause_threshold]
        by_frame_size([int(ms) for ms in args.frame_ms.split(",")], thresholds, args.alignments)
    return 0


if __name__ == "__main__":
    sys.exit(main())
