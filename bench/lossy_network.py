"""Direct-WebRTC calls through a network that loses, delays and reorders packets: the worker's
receive buffers and the callers' ways of sending side by side.

The caller (aiortc, ``devtools.netem.caller``) and the worker (``duplex-agent serve``,
reference model, echo responder) each run in a network namespace of their own, joined only
through the userspace forwarder of ``devtools.netem``, which impairs UDP both ways. A line
is a caller's way of sending and the worker's receive buffer (``--lines SENDER/BUFFER,...``):
- sender ``libopus-rr``: as browsers and phone apps on libwebrtc send: libopus with in-band
  FEC, its expected loss set from the worker's RTCP receiver reports; ``aiortc-opus``: a
  plain aiortc peer: aiortc's own Opus encoder, no FEC;
- buffer ``adaptive`` (ours) or ``aiortc`` (aiortc's jitter buffer: the worker runs as
  ``python -m bench.aiortc_receive``).
One worker and one caller per line, each behind its own link with the same impairments;
each trial runs every line once, in a rotating order, so all meet the same load.

Each trial is one call: the caller asks a question and listens to the reply, then asks
a long one and talks over the reply. Per condition and line it prints:
- heard: the share of the question's content words that the worker's recognizer got
  (mean), and in how many calls it got them all;
- reply right: calls whose reply ("You said: ...") carries every content word;
- turn: caller-heard turn latency, p50 (last speech frame sent -> first loud reply frame);
- barge-in: as the caller hears it, p50 (first loud frame of the interruption sent -> last
  loud frame of the agent heard), and in how many trials the agent stopped;
- connect: offer -> the data channel open and the agent's audio heard, p50 and the slowest;
- buf p95, late: the adaptive receive buffer's delay from a packet's arrival at the worker to
  its frame handed to the call path, p95 per call (the worker's per-call /metrics gauge, read
  before hang-up; the worst call shown), and the packets it dropped as too late (all calls);
  "-" for aiortc's buffer, which reports neither;
- FEC/PLC of lost: of the caller's packets the adaptive buffer found missing (all calls, in
  speech and in silence), how many frames it recovered from in-band FEC and how many it
  concealed (a frame whose packet was not Opus is concealed too); for a ``libopus-rr`` caller,
  the loss its FEC was planned for at the end of the call (p50), from the worker's reports;
- what the forwarder really did to the trials' UDP, each way (caller -> worker / worker ->
  caller): dropped, reordered, longest run of drops.
The clean condition is the floor of the others. After the table, what the recognizer heard in
every call that missed a content word. Never passes or fails.

``--livekit``: then the LiveKit path under the same conditions: ``--livekit-calls`` calls one
after another, each a new caller on the real livekit SDK (``bench.livekit_callers``) joining a
new room in the caller's namespace; the loopback LiveKit server and a LiveKit worker
(``duplex-agent start``) in the worker's, talking to each other unimpaired. Each caller barges
in on each reply again and again for ``--livekit-seconds``; per condition: in how many calls
the caller heard the agent (300 ms of its loud audio, what a caller waits for before it
interrupts), words heard (the share of the content words of the caller's turns found in the worker's
transcripts of the caller, all turns together), barge-ins tried, barge-in as heard
(interruption's onset sent -> the agent quiet at the caller) p50, replies that played out
anyway, questions with no reply, reply latency p50 (the question's end sent -> first loud
reply frame), and the forwarder's counts. Behind LiveKit the caller's SDK sends RED, so a
packet lost on its uplink is rebuilt from the next (the loopback server answers as LiveKit).

Run: python -m bench.lossy_network [--quick] [--trials N] [--lines libopus-rr/adaptive,aiortc-opus/adaptive]
         [--conditions clean,bursts]
         [--livekit [--livekit-seconds S] [--livekit-calls N]]
(as root: it makes network namespaces).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import Report
from devtools.netem import CLEAN, TO_CALLER, TO_WORKER, GilbertElliott, ImpairedLink, Impairment, unavailable_reason
from devtools.netem.caller import SENDERS
from devtools.netem.calls import (
    WORKER_MODULE,
    CallerProcess,
    content_words,
    livekit_callers,
    recall,
    recall_of_turns,
    receive_figures,
    start_livekit,
    start_worker,
    write_clips,
)

QUESTION = "Please book a table for two people tonight."
LONG = ("I would like to hear about the weather in the mountains this weekend and whether "
        "the trails are open for hiking with my family.")
STOP = "Wait, stop please."
#: sender/buffer: the caller's way of sending its voice, the worker's receive buffer
LINES = ("libopus-rr/adaptive", "libopus-rr/aiortc", "aiortc-opus/adaptive")
JITTER = Impairment(delay_ms=40, jitter_ms=15)
#: name -> the impairment applied both ways
CONDITIONS: dict[str, Impairment] = {
    "clean": CLEAN,
    "3% loss + 40±15 ms": Impairment(loss=0.03, delay_ms=40, jitter_ms=15),
    "10% loss": Impairment(loss=0.10),
    "40±15 ms jitter": JITTER,
    # ~4.5 % of packets in the bad state, 6.7 packets per burst on average, 20 at most.
    "bursts ~5%": Impairment(bursts=GilbertElliott(p=0.007, r=0.15, max_bad=20)),
}
SHORT_NAMES = {"clean": "clean", "3%": "3% loss + 40±15 ms", "10%": "10% loss", "jitter": "40±15 ms jitter",
               "bursts": "bursts ~5%"}
#: --quick: the headline condition and heavy loss, our buffer beside aiortc's, one call each; then
#: the LiveKit path under both, with fewer and shorter calls.
QUICK = {"lines": "libopus-rr/adaptive,libopus-rr/aiortc", "conditions": "3%,10%"}
#: LiveKit calls per condition, and each one's seconds: by default, and under --quick.
LIVEKIT_CALL, QUICK_LIVEKIT_CALL = (10, 20.0), (3, 15.0)
#: The worker's line and its floor: the same caller, aiortc's receive buffer as shipped.
OURS, FLOOR = "libopus-rr/adaptive", "libopus-rr/aiortc"
#: A LiveKit call counts as heard once its caller heard this much loud agent audio.
HEARD_AGENT_MS = 300


def figure_suffix(condition: str) -> str:
    """'' for the headline condition, else a stable id part for it."""
    short = next(k for k, v in SHORT_NAMES.items() if v == condition)
    return "" if short == "3%" else "." + short.replace("%", "pct")


@dataclass
class Trials:
    recalls: list[float] = field(default_factory=list)
    replies_right: int = 0
    turn_ms: list[float] = field(default_factory=list)
    barge_in_ms: list[float] = field(default_factory=list)
    stopped: int = 0
    failed: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # direction -> the forwarder's counts
    buffer_p95_ms: list[float] = field(default_factory=list)  # per call: the worker's arrival-to-handoff p95
    buffer_late: int = 0  # packets the worker's buffer dropped as too late, all calls
    frames: dict[str, int] = field(default_factory=dict)  # the adaptive buffer's frame outcomes, all calls
    connect_ms: list[float] = field(default_factory=list)  # offer -> data channel open and agent audio heard
    misses: list[str] = field(default_factory=list)  # what the recognizer heard when it missed a word
    fec_plan: list[int] = field(default_factory=list)  # per call: the loss (%) the caller's FEC was planned for at the end

    @property
    def n(self) -> int:
        return len(self.recalls) + len(self.failed)


@dataclass
class Rig:
    name: str  # sender/buffer
    link: ImpairedLink
    caller: CallerProcess


def one_trial(rig: Rig, trials: Trials) -> None:
    try:
        connected = rig.caller.step("connect")
        if not connected["ok"]:
            trials.failed.append(f"connect: {connected['error']}")
            return
        trials.connect_ms.append(connected["connect_ms"] + connected["audio_ms"])
        turn = rig.caller.step("turn")
        barge = rig.caller.step("barge_in")
        figures = receive_figures(rig.link)  # the live call's, from the worker's /metrics
        if "delay_ms_p95" in figures:
            trials.buffer_p95_ms.append(figures["delay_ms_p95"])
            trials.buffer_late += int(figures.get("packets_late", 0))
            for figure in ("packets_lost", "frames_recovered", "frames_concealed"):
                trials.frames[figure] = trials.frames.get(figure, 0) + int(figures.get(figure, 0))
    finally:
        rig.caller.step("hangup")
    if not turn["ok"] or not barge["ok"]:
        trials.failed.append(turn.get("error") or barge.get("error") or "?")
        return
    trials.recalls.append(recall(QUESTION, turn["heard"]))
    if trials.recalls[-1] < 1.0:
        trials.misses.append(turn["heard"])
    trials.replies_right += recall(QUESTION, turn["reply"]) == 1.0
    if turn["turn_ms"] is not None:
        trials.turn_ms.append(turn["turn_ms"])
    trials.barge_in_ms.append(barge["barge_in_ms"])
    if "expected_loss_percent" in barge:
        trials.fec_plan.append(barge["expected_loss_percent"])
    trials.stopped += bool(barge["stopped"])


def p50(values: list[float]) -> str:
    return f"{statistics.median(values):5.0f}" if values else "    -"


def line(condition: str, name: str, t: Trials) -> str:
    up, down = t.counts.get(TO_WORKER, {}), t.counts.get(TO_CALLER, {})
    heard = statistics.mean(t.recalls) if t.recalls else float("nan")
    all_words = sum(r == 1.0 for r in t.recalls)
    net = (f"{up.get('dropped', 0)}/{down.get('dropped', 0)} of {up.get('udp_in', 0)}/{down.get('udp_in', 0)}"
           f" dropped, {up.get('reordered', 0)}/{down.get('reordered', 0)} reordered,"
           f" run<={up.get('longest_loss_run', 0)}/{down.get('longest_loss_run', 0)}")
    failed = f"  failed: {'; '.join(t.failed)}" if t.failed else ""
    buffer = (f"{max(t.buffer_p95_ms):4.0f} ms {t.buffer_late:4d}" if t.buffer_p95_ms else "   -       -")
    frames = (f"{t.frames['frames_recovered']}/{t.frames['frames_concealed']} of {t.frames['packets_lost']}"
              if t.frames else "-") + (f", plan {statistics.median(t.fec_plan):.0f}%" if t.fec_plan else "")
    connect = f"{p50(t.connect_ms)}/{max(t.connect_ms):5.0f} ms" if t.connect_ms else "    -/    - ms"
    return (f"{condition:<19} {name:<20} {100 * heard:5.0f}% {all_words}/{t.n:<3}  {t.replies_right}/{t.n:<5}"
            f"{p50(t.turn_ms)} ms  {p50(t.barge_in_ms)} ms  {t.stopped}/{t.n:<4} {connect} {buffer}  {frames:<22} "
            f"{net}{failed}")


def load() -> str:
    """The machine's 1/5/15-minute load averages, as uptime prints them."""
    return ", ".join(f"{average:.2f}" for average in os.getloadavg())


def forwarder_counts(counts: dict) -> str:
    up, down = counts[TO_WORKER].as_dict(), counts[TO_CALLER].as_dict()
    return (f"{up['dropped']}/{down['dropped']} of {up['udp_in']}/{down['udp_in']} dropped, "
            f"{up['reordered']}/{down['reordered']} reordered, run<={up['longest_loss_run']}/{down['longest_loss_run']}")


def livekit_part(conditions: list[str], seconds: float, calls: int, folder: Path, seed: int, report: Report) -> None:
    print(f"\n== the LiveKit path through the same link: {calls} calls per condition, one after another, each a "
          f"caller (livekit SDK) joining a new room and barging in for {seconds:g} s; loopback LiveKit server + "
          "LiveKit worker behind the link ==", flush=True)
    with ExitStack() as stack:
        link = stack.enter_context(ImpairedLink(seed=seed + 1000))
        url = start_livekit(link, stack.enter_context(open(folder / "livekit-server.log", "w")),
                            stack.enter_context(open(folder / "livekit-worker.log", "w")))
        caller_log = stack.enter_context(open(folder / "livekit-caller.log", "w"))
        warm = livekit_callers(link, url, min(seconds, 15.0), caller_log)  # waits for the worker; not counted
        print(f"   warm-up: {warm['callers'][0].get('error') or 'ok'}", flush=True)
        print(f"{'condition':<19} {'heard agent':>11} {'words heard':>14} {'barge-ins':>9} {'heard stop p50':>14} "
              f"{'played out':>10} {'no reply':>8} {'reply p50':>9}   forwarder (caller->worker / worker->caller)",
              flush=True)
        for condition in conditions:
            link.impair(to_worker=CONDITIONS[condition], to_caller=CONDITIONS[condition])
            link.reset_counts()
            done = [livekit_callers(link, url, seconds, caller_log)["callers"][0] for _ in range(calls)]
            # heard: the caller heard as much of the agent as it waits for before it interrupts
            heard_agent = sum(c["loud_ms"] >= HEARD_AGENT_MS for c in done)
            errors = "; ".join(c["error"] for c in done if c.get("error"))
            heard, said_words = recall_of_turns([t for c in done for t in c["said"]], [t for c in done for t in c["heard"]])
            suffix = figure_suffix(condition)
            report.add(f"lossy_network.livekit_heard_agent{suffix}", f"LiveKit calls in which the caller heard the "
                       f"agent, {condition} both ways, each a new caller barging in for {seconds:g} s",
                       heard_agent, unit=f"of {calls} calls", n=calls, area="network")
            report.add(f"lossy_network.livekit_words_heard{suffix}", f"content words the LiveKit worker heard of "
                       f"{calls} callers barging in for {seconds:g} s each, {condition} (SFU answering RED)",
                       100 * heard, unit="%", n=said_words, area="network")
            print(f"{condition:<19} {f'{heard_agent} of {calls}':>11} {f'{100 * heard:.0f} % of {said_words}':>14} "
                  f"{sum(c['attempts'] for c in done):>9} "
                  f"{p50([v for c in done for v in c['heard_stop_ms']])} ms     "
                  f"{sum(c['played_out'] for c in done):>10} {sum(c['no_reply'] for c in done):>8} "
                  f"{p50([v for c in done for v in c['reply_after_ms']])} ms   "
                  f"{forwarder_counts(link.counts())}{'  errors: ' + errors if errors else ''}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1, help="calls per condition and line")
    parser.add_argument("--lines", default=",".join(LINES),
                        help=f"SENDER/BUFFER, comma-separated (senders: {', '.join(SENDERS)}; buffers: adaptive, aiortc)")
    parser.add_argument("--conditions", default=",".join(SHORT_NAMES),
                        help=f"comma-separated, of: {', '.join(SHORT_NAMES)}")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--livekit", action="store_true", help="then the LiveKit path under the same conditions")
    parser.add_argument("--livekit-seconds", type=float, default=None,
                        help=f"each LiveKit call's time (default {LIVEKIT_CALL[1]:g}; --quick: {QUICK_LIVEKIT_CALL[1]:g})")
    parser.add_argument("--livekit-calls", type=int, default=None,
                        help=f"LiveKit calls per condition (default {LIVEKIT_CALL[0]}; --quick: {QUICK_LIVEKIT_CALL[0]})")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct calls (with --livekit)")
    parser.add_argument("--quick", action="store_true",
                        help=f"lines {QUICK['lines']}, conditions {QUICK['conditions']}, one call each; "
                             "LiveKit calls too")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.conditions, args.trials, args.livekit = QUICK["lines"], QUICK["conditions"], 1, True
    calls, seconds = QUICK_LIVEKIT_CALL if args.quick else LIVEKIT_CALL
    args.livekit_calls = args.livekit_calls or calls
    args.livekit_seconds = args.livekit_seconds or seconds
    reason = unavailable_reason()
    if reason:  # skipped, not failed: a machine without namespaces cannot run it
        print(f"bench.lossy_network skipped: it needs network namespaces (as root): {reason}")
        return
    report = Report("lossy_network", quick=args.quick)
    lines = [m for m in args.lines.split(",") if m]
    for name in lines:
        sender, _, buffer = name.partition("/")
        if sender not in SENDERS or buffer not in ("adaptive", "aiortc"):
            parser.error(f"--lines: {name!r} is not SENDER/BUFFER")
    conditions = [SHORT_NAMES[c] for c in args.conditions.split(",") if c]
    from devtools.speech import speak

    started, load_at_start = time.perf_counter(), load()
    folder = Path(tempfile.mkdtemp(prefix="lossy-network-"))
    clips = write_clips(folder / "clips", speak(QUESTION, 48000, before_ms=300, after_ms=1200),
                        speak(LONG, 48000, before_ms=300, after_ms=800), speak(STOP, 48000, after_ms=100))
    if not args.no_direct:
        direct_part(args, lines, conditions, clips, folder, report)
    if args.livekit:
        livekit_part(conditions, args.livekit_seconds, args.livekit_calls, folder, args.seed, report)
    report.write()
    print(f"({time.perf_counter() - started:.0f} s; load average {load_at_start} at the start, {load()} at the end; "
          f"logs in {folder})")


def direct_part(args: argparse.Namespace, lines: list[str], conditions: list[str], clips: Path,
                folder: Path, report: Report) -> None:
    print(f"== direct WebRTC calls through an impaired link, {args.trials} call(s) per condition and line; "
          f"question: {QUESTION!r} ({len(content_words(QUESTION))} content words) ==", flush=True)
    with ExitStack() as stack:
        rigs = []
        for i, name in enumerate(lines):
            sender, _, buffer = name.partition("/")
            link = stack.enter_context(ImpairedLink(seed=args.seed + 100 * i))
            stem = name.replace("/", "-")
            start_worker(link, stack.enter_context(open(folder / f"worker-{stem}.log", "w")),
                         module="bench.aiortc_receive" if buffer == "aiortc" else WORKER_MODULE)
            caller_log = stack.enter_context(open(folder / f"caller-{stem}.log", "w"))
            rigs.append(Rig(name, link, stack.enter_context(CallerProcess(link, clips, caller_log, sender))))
        for rig in rigs:  # the models' first turn is slow: a warm-up call on a clean link, not counted
            answers = [rig.caller.step(step) for step in ("connect", "turn", "hangup")]
            failed = [a.get("error") for a in answers if not a["ok"]]
            print(f"   warm-up call ({rig.name}): {'failed: ' + str(failed) if failed else 'ok'}", flush=True)
        print(f"{'condition':<19} {'sender/buffer':<20} {'heard':>6} {'all':<5} {'reply':<7}{'turn p50':>10} "
              f"{'barge-in p50':>11} {'stopped':<6} {'connect p50/max':>15} {'buf p95':>7} {'late':>4}  "
              f"{'FEC/PLC of lost':<22} forwarder (caller->worker / worker->caller)", flush=True)
        misses = []
        for condition in conditions:
            results = {rig.name: Trials() for rig in rigs}
            for rig in rigs:
                rig.link.impair(to_worker=CONDITIONS[condition], to_caller=CONDITIONS[condition])
                rig.link.reset_counts()
            for trial in range(args.trials):
                for rig in rigs[trial % len(rigs):] + rigs[:trial % len(rigs)]:
                    one_trial(rig, results[rig.name])
            for rig in rigs:
                results[rig.name].counts = {d: c.as_dict() for d, c in rig.link.counts().items()}
                print(line(condition, rig.name, results[rig.name]), flush=True)
                misses += [f"   {condition}, {rig.name}: {heard!r}" for heard in results[rig.name].misses]
            if OURS in results:
                ours, floor = results[OURS], results.get(FLOOR)
                report.add(f"lossy_network.words_heard{figure_suffix(condition)}", "content words the worker heard "
                           f"of a direct WebRTC caller's question, {condition}, both ways; floor: aiortc's receive "
                           "buffer", 100 * statistics.mean(ours.recalls) if ours.recalls else None,
                           floor=100 * statistics.mean(floor.recalls) if floor and floor.recalls else None,
                           unit="%", n=ours.n, area="network")
        if misses:
            print("what the recognizer heard in the calls that missed a content word:", *misses, sep="\n", flush=True)


if __name__ == "__main__":
    main()
