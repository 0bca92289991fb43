"""`make bench`: every scenario benchmark, one after another, each in its own process.

``python -m bench --quick`` (``make bench-quick``) runs each one's short form. Each writes its figures to
bench/results/<name>.json (``bench.report``); ``python -m bench.figures`` renders them into
docs/figures.md and the README. ``python -m bench --only a,b`` runs the named ones.

A bench that needs something this machine may lack (root for network namespaces, the vLLM-Omni venv)
is skipped with a line saying why, so the suite still runs end to end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bench:
    name: str  # the module under bench/ and the results file's name
    question: str  # the figure a user reads
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    needs: str = ""  # "root": network namespaces; "moshi": the moshi package; "chromium": a headless browser


def _needs_root() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces): run it with sudo"
    if shutil.which("ip") is None:
        return "needs ip (iproute2) for network namespaces"
    return ""


SUITE = (
    Bench("direct_heard", "barge-in as a direct WebRTC caller hears it, beyond a bare aiortc peer"),
    Bench("livekit_path", "barge-in as a LiveKit caller hears it, beyond a bare livekit.rtc agent"),
    Bench("echo_barge_in", "a speakerphone caller: self-interruptions on the agent's own echo, barge-in through it"),
    Bench("browser_bargein", "barge-in as a Chromium caller on the page gets it, per echo canceller setting",
          needs="chromium"),
    Bench("false_pauses", "coughs, knocks and backchannels over the agent: resumed, not cancelled"),
    Bench("receive_buffer", "caller frames lost on a lossy, jittery network: ours vs aiortc's buffer"),
    Bench("lossy_network", "words the worker heard through a network that loses and reorders", needs="root"),
    Bench("livekit_vs_direct", "worker CPU per call: LiveKit beside direct WebRTC"),
    Bench("remote_hop", "what the hop to a remote vLLM-Omni server adds per event"),
    Bench("backend_failover", "the gap a caller hears when its GPU host dies"),
    Bench("livekit_agents_bargein", "barge-in in a LiveKit Agents app: our DuplexModel vs LiveKit's adapter"),
    Bench("livekit_agents_tools", "what an Agent's @function_tool adds to a turn in a LiveKit Agents app"),
    Bench("caller_turn_latency", "turn latency as the caller hears it"),
    Bench("phone_audio", "phone-line callers beside wideband: barge-in, false pauses, words understood"),
    Bench("tool_overhead", "what a tool call adds to a turn as the caller hears it, in-process and remote"),
    Bench("answering_machine", "answering-machine detection on outbound calls: right, and how soon"),
    Bench("dial_answer", "outbound calls with a greeting: the far end's answer to the agent's first sound"),
    Bench("asr_accuracy", "words the recogniser mishears, and the time it takes a turn, per Whisper model"),
    Bench("overload", "the calls a saturated worker already has while a crowd arrives, with --max-cpu and without"),
    Bench("soak", "an hour of direct, LiveKit and LiveKit Agents calls: growth, calls lost, late vs early p95"),
    Bench("moshi_batch", "Moshi conversations one device steps in real time (CPU: the tiny config)", needs="moshi"),
)


def unmet(bench: Bench) -> str:
    """Why this bench cannot run here, or ''."""
    if bench.needs == "root":
        return _needs_root()
    if bench.needs == "moshi" and importlib.util.find_spec("moshi") is None:
        return "needs the moshi package (make install-moshi)"
    if bench.needs == "chromium":
        from tests.webrtc.browser import chromium_missing_reason

        return f"needs Chromium: {chromium_missing_reason()}" if chromium_missing_reason() else ""
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each bench's short form")
    parser.add_argument("--only", default="", help="comma-separated bench names")
    args = parser.parse_args(argv)
    chosen = [b for b in SUITE if not args.only or b.name in args.only.split(",")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    failed, skipped, started = [], [], time.monotonic()
    for bench in chosen:
        why = unmet(bench)
        if why:
            print(f"\n######## bench.{bench.name}: skipped: {why}", flush=True)
            skipped.append(bench.name)
            continue
        command = [sys.executable, "-m", f"bench.{bench.name}", *(bench.quick if args.quick else bench.full)]
        print(f"\n######## python -m bench.{bench.name} {' '.join(command[3:])}".rstrip(), flush=True)
        begun = time.monotonic()
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            failed.append(bench.name)
        print(f"######## bench.{bench.name}: {time.monotonic() - begun:.0f} s", flush=True)
    print(f"\n{len(chosen) - len(failed) - len(skipped)} benches ran in {time.monotonic() - started:.0f} s"
          + (f"; skipped: {', '.join(skipped)}" if skipped else "")
          + (f"; did not finish: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
