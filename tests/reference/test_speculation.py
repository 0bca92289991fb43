"""Speculative ASR: one transcription per turn at a time, each piece of audio transcribed once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from devtools.speech import speak, words
from duplex_agent.plugins.reference.asr import WhisperRecognizer
from duplex_agent.plugins.reference.speculation import SpeculativeTranscript

SR = 16000
UNIT = 1600  # the reference model's 100 ms units


class CountingTranscriber:
    """Records how much audio it was given and how many calls overlapped; each call
    finishes when the test releases it (a real signal, not a sleep)."""

    def __init__(self) -> None:
        self.samples = 0
        self.running = 0
        self.most_at_once = 0
        self.calls: list[asyncio.Future[None]] = []

    async def __call__(self, audio: np.ndarray) -> str:
        self.samples += audio.size
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        gate = asyncio.get_running_loop().create_future()
        self.calls.append(gate)
        await gate
        self.running -= 1
        return f"piece{len(self.calls)}"

    def release_all(self) -> None:
        for gate in self.calls:
            if not gate.done():
                gate.set_result(None)


def units(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i : i + UNIT] for i in range(0, audio.size, UNIT)]


def monologue(sentences: int, pause_ms: int = 300, sentence_s: float = 1.0) -> np.ndarray:
    loud = (np.sin(np.arange(int(SR * sentence_s)) * 2 * np.pi * 220 / SR) * 0.3).astype(np.float32)
    pause = np.zeros(SR * pause_ms // 1000, np.float32)
    return np.concatenate([part for _ in range(sentences) for part in (loud, pause)])


@pytest.mark.parametrize("sentence_s, most_work", [(3.5, 1.0), (1.0, 2.5)], ids=["long-pieces", "short-pieces"])
async def test_a_monologue_is_transcribed_about_once_and_one_piece_at_a_time(sentence_s, most_work):
    """Pieces of 3 s or more are transcribed once; shorter guesses are redone with more
    context, which costs at most a few seconds per piece (the old way: ~n/2 times the audio)."""
    fake = CountingTranscriber()
    transcript = SpeculativeTranscript(fake, SR)
    audio = monologue(10, sentence_s=sentence_s)
    for i, unit in enumerate(units(audio)):
        transcript.add(unit)
        await asyncio.sleep(0)  # let a started transcription reach the transcriber
        if i % 7 == 0:
            fake.release_all()  # some pieces finish while the caller goes on, some do not
    fake.release_all()
    text_task = asyncio.ensure_future(transcript.text())
    while not text_task.done():
        await asyncio.sleep(0)
        fake.release_all()
    text = text_task.result()
    assert fake.most_at_once == 1
    assert fake.samples <= most_work * audio.size
    numbers = [int(part.removeprefix("piece")) for part in text.split()]
    assert numbers == sorted(set(numbers)) and numbers[-1] == len(fake.calls)  # pieces in order, none twice
    assert transcript.transcriptions == len(fake.calls) >= 2


async def test_no_speech_means_no_transcription():
    fake = CountingTranscriber()
    transcript = SpeculativeTranscript(fake, SR)
    for unit in units(np.zeros(SR * 2, np.float32)):
        transcript.add(unit)
    assert await transcript.text() == ""
    assert fake.calls == []


async def test_pieces_split_at_pauses_give_the_words_of_the_whole_turn():
    """Real Whisper on Piper's voice: the words of three sentences said with pauses between."""
    recognizer = WhisperRecognizer.shared()
    sentences = ["The quick brown fox jumps over the lazy dog.", "I would like a cup of tea.",
                 "Please call me back tomorrow."]
    gap = np.zeros(SR * 400 // 1000, np.float32)
    audio = np.concatenate([part for s in sentences for part in (speak(s), gap)])
    loop = asyncio.get_running_loop()
    transcript = SpeculativeTranscript(lambda a: loop.run_in_executor(None, recognizer.transcribe, a), SR)
    for unit in units(audio):
        transcript.add(unit)
    text = await transcript.text()
    assert transcript.transcriptions >= 2
    expected = words(" ".join(sentences))
    got = words(text)
    assert sum(w in got for w in expected) >= 0.85 * len(expected), text
