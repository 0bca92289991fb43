"""Turn-taking latency of the reference model, where the time goes, and concurrency.

First each stage's real-time factor (bench.stage_rtf). Then each utterance is Piper
speech fed to a session in real time (20 ms frames on a wall-clock schedule). Turn-taking
latency is the end of the user's speech to the first agent audio delta, with the echo
responder, measured twice in the same run: the end-of-turn model on (the default) and off
(the fixed silence window alone). Then several sessions talk at once to find how many
this machine serves in real time. This is the worker's share; bench.caller_turn_latency
measures what a caller over WebRTC hears.

Run: python -m bench.turn_latency [utterances] [--quick]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from bench import stage_rtf
from bench.stats import percentile, summary
from devtools.speech import speak
from duplex_agent.agent.models.vad import VadSettings
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.agent.session.local_backend import LocalBackend
from duplex_agent.plugins.reference.plugin import ReferencePlugin

RATE = 16000
FRAME = 320
SENTENCES = [
    "Please book a table for two people tonight.",
    "What time does the museum open tomorrow?",
    "I need a taxi to the airport.",
    "Can you read me my messages?",
    "Turn the lights off in the kitchen.",
    "How far is it to the train station?",
    "Remind me to call my sister at six.",
    "What is the weather like this weekend?",
    "Play some quiet music in the living room.",
    "Add milk and bread to my shopping list.",
    "Where did I park the car?",
    "Send a message to Anna saying I am late.",
    "How many steps did I walk today?",
    "Set a timer for ten minutes.",
    "What is on my calendar this afternoon?",
    "Find a pharmacy that is open now.",
    "Tell me a short story about a dragon.",
    "Is it going to rain on Monday?",
    "Order more coffee beans for the office.",
    "Call the dentist and move my appointment.",
]


@dataclass
class Turn:
    speech_end: float
    stopped: float | None = None
    transcribed: float | None = None
    first_audio: float | None = None


@dataclass
class SessionRun:
    turns: list[Turn] = field(default_factory=list)
    lagging: int = 0


async def talk(backend: LocalBackend, sentences: list[str], run: SessionRun, *, lead_ms: float = 300,
               end_of_turn: bool = True) -> None:
    runner = await backend.open()
    runner.send(p.SessionUpdate({"input_audio_format": "pcm_f32le", "input_sample_rate": RATE,
                                 "turn_detection": {"type": "server_vad", "end_of_turn": end_of_turn}}))
    reader = asyncio.create_task(_read(runner, run))
    loop = asyncio.get_running_loop()
    for sentence in sentences:
        speech = speak(sentence)
        audio = np.concatenate([np.zeros(int(RATE * lead_ms / 1000), np.float32), speech,
                                np.zeros(int(RATE * 2.5), np.float32)])
        start = loop.time()
        run.turns.append(Turn(speech_end=start + (lead_ms / 1000) + speech.size / RATE))
        for k, i in enumerate(range(0, audio.size, FRAME)):
            delay = start + k * FRAME / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            runner.send(p.InputAudioBufferAppend(audio[i:i + FRAME]))
    await asyncio.sleep(1.0)
    await runner.close()
    await reader


async def _read(runner, run: SessionRun) -> None:
    loop = asyncio.get_running_loop()
    async for event in runner.events():
        now = loop.time()
        turn = run.turns[-1] if run.turns else None
        if isinstance(event, p.SessionLagging):
            run.lagging += 1
        if turn is None:
            continue
        if isinstance(event, p.SpeechStopped) and turn.stopped is None:
            turn.stopped = now
        elif isinstance(event, p.InputTranscriptionCompleted) and turn.transcribed is None:
            turn.transcribed = now
        elif isinstance(event, p.ResponseAudioDelta) and turn.first_audio is None:
            turn.first_audio = now


def _ms(values: list[float]) -> list[float]:
    return [1000 * v for v in values]


def report_turns(run: SessionRun, end_of_turn: bool) -> None:
    done = [t for t in run.turns if t.first_audio is not None]
    settings = VadSettings()
    wait = (f"end-of-turn model on: {settings.end_of_turn_silence_ms} ms when P >= {settings.end_of_turn_threshold}, "
            f"else {settings.silence_duration_ms} ms" if end_of_turn
            else f"end-of-turn model off: silence window {settings.silence_duration_ms} ms")
    print(f"turn-taking latency, reference model, echo responder, one session, {len(run.turns)} utterances ({wait}):")
    print("  end of speech -> first audio delta: " + summary(_ms([t.first_audio - t.speech_end for t in done]), "ms", digits=0))
    print("where the time goes:")
    print("  end of speech -> speech_stopped (end-of-turn wait):       "
          + summary(_ms([t.stopped - t.speech_end for t in done if t.stopped]), "ms", digits=0))
    print("  speech_stopped -> transcript (ASR, mostly speculative):  "
          + summary(_ms([t.transcribed - t.stopped for t in done if t.stopped and t.transcribed]), "ms", digits=0))
    print("  transcript -> first audio (responder + first clause TTS): "
          + summary(_ms([t.first_audio - t.transcribed for t in done if t.transcribed]), "ms", digits=0))
    if len(done) < len(run.turns):
        print(f"  {len(run.turns) - len(done)} utterances got no audio reply")


async def main(utterances: int, quick: bool) -> None:
    if not quick:
        stage_rtf.main(5)
        print()
    plugin = ReferencePlugin(as_float32_audio)
    backend = LocalBackend(plugin, plugin.build_local_engine(), max_sessions=16)
    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(utterances)]
    for s in set(sentences):
        speak(s)  # synthesise the inputs before timing anything

    for end_of_turn in (True, False):
        run = SessionRun()
        await talk(backend, sentences, run, end_of_turn=end_of_turn)
        report_turns(run, end_of_turn)

    if quick:
        await backend.close()
        return
    print("concurrent sessions in real time (4 utterances each; 'real time' = every turn answered, "
          "p95 latency under 1.5 s, no lag events):")
    sustained = 0
    for sessions in (1, 2, 4, 6, 8, 10, 12):
        runs = [SessionRun() for _ in range(sessions)]
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        await asyncio.gather(*(talk(backend, sentences[i:i + 4], runs[i]) for i in range(sessions)))
        cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        latencies = _ms([t.first_audio - t.speech_end for r in runs for t in r.turns if t.first_audio])
        missing = sum(1 for r in runs for t in r.turns if t.first_audio is None)
        lag = sum(r.lagging for r in runs)
        print(f"  {sessions} sessions: {summary(latencies, 'ms', digits=0)}; lag events {lag}; "
              f"no reply {missing}; process CPU {cpu:.2f} cores", flush=True)
        if missing or lag or not latencies or percentile(latencies, 95) >= 1500:
            break
        sustained = sessions
    print(f"sessions sustained in real time on this machine: {sustained}")
    await backend.close()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    quick = "--quick" in sys.argv
    asyncio.run(main(int(numbers[0]) if numbers else (8 if quick else 20), quick))
