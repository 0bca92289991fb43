"""Barge-in and turn latency as the caller hears them on direct WebRTC: the worker beside its floor, same run.

Two servers, each its own process: the worker (``duplex-agent serve --plugin scripted``: a 1 s
tone reply to every turn, the real Silero onset VAD, edge barge-in with the pause) and the floor
(``bench.echo_peer --reply tone``: aiortc as shipped, a 1 s tone after the same 500 ms of the
caller's silence, stopped by the first 20 ms frame of the caller's that holds sound). Rounds
alternate between them with the same caller code (``bench.livekit_callers --transport direct``, a
process of its own): say a question, hear ~300 ms of the reply, say an interruption that runs on
into the next question.

- barge-in: the interruption's first sound handed to the caller's transport -> the agent's audio
  quiet at the caller (100 ms of it), where the reply was cut short;
- turn: the question's last sound handed to the transport -> the reply's first loud frame heard
  (the 500 ms end-of-turn silence included in both).

The caller's send side holds no queue: its track takes each frame at its 20 ms deadline and stamps
the onset then, and after a stall it catches up (under 200 ms) or restarts its schedule, never
sending old audio late. Beside the heard figures: the worker's own barge-in figure from its
/metrics (the caller's onset reaching the worker -> its first quiet frame out), and its pauses.

``--control CHECKOUT`` adds that checkout's worker (its .venv, its code) to the rounds: an A/B in one run.

Prints ours, the floor and the difference (p50/p95); never passes or fails on time.

``--other-voices`` has the callers interrupt in words and espeak-ng voices no test uses.

Run: python -m bench.direct_heard [--rounds 3] [--seconds 25] [--sessions 1] [--control ../main] [--other-voices]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.call_rig import Service, free_port, scrape, wait_for_metrics, write_speech
from bench.report import Report
from bench.stats import percentile, summary

PATHS = ("worker", "floor")
CONTROL = "control"  # the --control checkout's worker
OWN_FIGURE = re.compile(r"barge-in: silent ([\d.]+) ms after the caller's speech onset")


def server_command(path: str, port: int, host: str, sessions: int, control: str = "") -> list[str]:
    if path in ("worker", CONTROL):
        python = str(Path(control) / ".venv" / "bin" / "python") if path == CONTROL else sys.executable
        return [python, "-m", "duplex_agent.agent.app.cli", "serve", "--plugin", "scripted",
                "--max-sessions", str(max(4, sessions + 2)), "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", "bench.echo_peer", "--port", str(port), "--ice-address", host, "--reply", "tone"]


def one_round(port: int, speech: str, sessions: int, seconds: float) -> list[dict[str, object]]:
    """The callers' per-caller figures for one round against the server on ``port``."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.livekit_callers", "--transport", "direct", "--url", f"http://127.0.0.1:{port}",
         "--sessions", str(sessions), "--seconds", str(seconds), "--speech", speech, "--ignore-stdin"],
        capture_output=True, text=True, timeout=seconds + 90, stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    final = [line for line in lines if line.get("event") == "done"]
    if done.returncode != 0 or not final:
        print(f"  callers failed (rc {done.returncode}): {done.stderr[-800:]}", flush=True)
        return []
    return list(final[0]["callers"])  # type: ignore[arg-type]


def compare(name: str, ours: list[float], floor: list[float]) -> None:
    print(f"{name}:")
    print(f"  worker: {summary(ours, 'ms', digits=0)}")
    print(f"  floor:  {summary(floor, 'ms', digits=0)}")
    print(f"  beyond the floor: p50 {percentile(ours, 50) - percentile(floor, 50):.0f} ms, "
          f"p95 {percentile(ours, 95) - percentile(floor, 95):.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.direct_heard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per server, alternating")
    parser.add_argument("--seconds", type=float, default=25.0, help="length of one round")
    parser.add_argument("--sessions", type=int, default=1, help="simultaneous callers per round")
    parser.add_argument("--control", default="", metavar="CHECKOUT",
                        help="also run that checkout's worker (its .venv), round for round")
    parser.add_argument("--other-voices", action="store_true",
                        help="interruptions in words and espeak-ng voices no test uses")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 15 s per server")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 2, 15.0
    report = Report("direct_heard_other_voices" if args.other_voices else "direct_heard", quick=args.quick)
    voices = ", interruptions in other words and voices" if args.other_voices else ""
    tag = ".other_voices" if args.other_voices else ""
    paths = ("worker", CONTROL, "floor") if args.control else PATHS

    from duplex_agent.webrtc.direct.host_address import interface_ipv4

    host = interface_ipv4()  # media needs ICE on a real interface; only this machine's address
    figures: dict[str, dict[str, list[float]]] = {p: {"heard": [], "turn": [], "worker_own": []} for p in paths}
    counts = {p: {"attempts": 0, "played_out": 0, "no_reply": 0} for p in paths}
    with tempfile.TemporaryDirectory(prefix="direct-heard-") as tmp:
        log_dir = Path(tmp)
        speech = str(log_dir / "speech.npz")
        write_speech(speech, other_voices=args.other_voices)
        ports = {p: free_port() for p in paths}
        # A control worker runs its checkout's code: "python -m" imports from its folder first.
        services = {p: Service(p, server_command(p, ports[p], host, args.sessions, args.control), log_dir / f"{p}.log",
                               **({"cwd": Path(args.control).resolve()} if p == CONTROL else {}))
                    for p in paths}
        try:
            for service in services.values():
                service.start()
            for path, service in services.items():
                wait_for_metrics(service, ports[path], 90)
            print(f"direct barge-in and turn as heard: {args.rounds} rounds x {args.seconds:g} s per server, "
                  f"{args.sessions} caller(s), alternating", flush=True)
            for index in range(args.rounds):
                for path in paths:
                    before = scrape(ports[path])
                    callers = one_round(ports[path], speech, args.sessions, args.seconds)
                    after = scrape(ports[path])
                    heard = [float(v) for c in callers for v in c.get("heard_stop_ms", [])]
                    figures[path]["heard"] += heard
                    figures[path]["turn"] += [float(v) for c in callers for v in c.get("reply_after_ms", [])]
                    for key in counts[path]:
                        counts[path][key] += sum(int(c.get(key, 0)) for c in callers)
                    line = f"  round {index + 1} {path}: barge-in heard {summary(heard, 'ms', digits=0)}"
                    if path != "floor" and before and after:
                        counted = after.barge_ins_since(before).get(float("inf"), 0.0)
                        line += f"; {counted:.0f} barge-ins counted in the worker's /metrics"
                    print(line, flush=True)
        finally:
            for service in services.values():
                service.stop()
        # A worker logs its own figure for each barge-in: onset reaching it -> first quiet frame out.
        for path in paths[:-1]:
            figures[path]["worker_own"] = [float(m) for m in OWN_FIGURE.findall(
                services[path].log_path.read_text(errors="replace"))]
    print()
    for path in paths:
        c = counts[path]
        print(f"{path}: {c['attempts']} interruptions, {c['played_out']} replies played out regardless, "
              f"{c['no_reply']} questions unanswered")
    compare("barge-in as the caller hears it", figures["worker"]["heard"], figures["floor"]["heard"])
    compare("turn latency as the caller hears it", figures["worker"]["turn"], figures["floor"]["turn"])
    if args.control:
        compare("the control's barge-in as the caller hears it", figures[CONTROL]["heard"], figures["floor"]["heard"])
    for path in paths[:-1]:
        print(f"the {path}'s own barge-in figure (the onset reaching it -> its first quiet frame out): "
              f"{summary(figures[path]['worker_own'], 'ms', digits=0)}")
    heard, floor = figures["worker"]["heard"], figures["floor"]["heard"]
    for q in (50, 95):
        report.add(f"direct{tag}.bargein_heard_p{q}", f"barge-in as a direct WebRTC caller hears it, p{q} (first "
                   f"sound of the interruption sent -> the agent quiet{voices}); floor: a bare aiortc peer", percentile(heard, q),
                   floor=percentile(floor, q), unit="ms", n=len(heard), area="barge-in")
    turn, turn_floor = figures["worker"]["turn"], figures["floor"]["turn"]
    report.add(f"direct{tag}.turn_heard_p50", "turn latency as a direct WebRTC caller hears it, p50, scripted model "
               "(500 ms end-of-turn silence in both)", percentile(turn, 50), floor=percentile(turn_floor, 50),
               unit="ms", n=len(turn), area="turn")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
