"""Answering-machine detection on greetings as a phone line carries them: people's short ones
over line noise, voicemail boxes' long ones with a beep."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from devtools.phone_greetings import MACHINE_GREETINGS, human, machine
from duplex_agent.agent.telephony.amd import FRAME, AnsweringMachineDetector, Verdict, is_tone


def detect(audio: np.ndarray, rate: int = 8000) -> AnsweringMachineDetector:
    detector = AnsweringMachineDetector(rate)
    step = FRAME * rate // 8000
    for start in range(0, audio.size, step):
        detector.push(audio[start:start + step])
    return detector


@pytest.mark.parametrize(("text", "noise"), [("Hello?", -36.0), ("Hello, who is calling?", -42.0)])
def test_a_person_is_told_within_three_seconds_of_their_first_word(text, noise):
    clip = human(text, lead_s=0.5, noise_dbfs=noise, rng=np.random.default_rng(1))
    decision = detect(clip.audio).decision
    assert decision is not None and decision.verdict is Verdict.HUMAN, decision
    assert decision.at_s - clip.starts_at_s < 3.0


@pytest.mark.parametrize(("text", "voice"), [(MACHINE_GREETINGS[1], "en-us"), (MACHINE_GREETINGS[2], "en-gb+m3")])
def test_a_voicemail_box_is_told_and_its_beep_ends_the_greeting(text, voice):
    clip = machine(text, voice, lead_s=0.5, rng=np.random.default_rng(2))
    detector = detect(clip.audio)
    decision = detector.decision
    assert decision is not None and decision.verdict is Verdict.MACHINE, decision
    assert decision.at_s - clip.starts_at_s < 3.0
    assert clip.beep_ends_at_s is not None and detector.greeting_over_at_s is not None
    assert abs(detector.greeting_over_at_s - clip.beep_ends_at_s) < 0.1


def test_the_decision_is_the_same_from_the_room_rate():
    clip = human("Yes, speaking.", lead_s=0.3, noise_dbfs=-42.0, rng=np.random.default_rng(3))
    at_48k = soxr.resample(clip.audio, 8000, 48000).astype(np.float32)
    narrow, wide = detect(clip.audio).decision, detect(at_48k, 48000).decision
    assert narrow is not None and wide is not None and narrow.verdict is wide.verdict is Verdict.HUMAN
    assert abs(narrow.at_s - wide.at_s) <= 0.06


def test_silence_after_the_answer_is_someone_waiting():
    decision = detect(np.zeros(8000 * 6, np.float32)).decision
    assert decision is not None and decision.verdict is Verdict.HUMAN and decision.at_s == pytest.approx(5.0, abs=0.05)


def test_a_tone_is_a_tone_and_a_voice_is_not():
    t = np.arange(FRAME) / 8000
    assert is_tone((0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))
    clip = human("Hello, this is Maria.", lead_s=0.0, noise_dbfs=-60.0, rng=np.random.default_rng(4))
    frames = [clip.audio[i:i + FRAME] for i in range(0, int(1.2 * 8000), FRAME)]
    loud = [f for f in frames if float(np.sqrt(np.mean(f ** 2))) > 0.02]
    assert loud and sum(is_tone(f) for f in loud) < len(loud) / 3
