"""How the far end of an outbound call answers: a person's short greeting, or a voicemail box's
long one and its beep, as a phone line carries them (``livekit_server.sip.phone_line``).

People say a few words in Piper's voice and wait, over line noise; voicemail boxes speak
espeak-ng greetings of 3-15 s and beep at 1 kHz. Each clip starts at the answer: a little quiet,
then the greeting. The set is made the same way every run (a seeded generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devtools.livekit_server.sip.phone_line import LINE_RATE, LineDirection
from devtools.speech import espeak, speak

HUMAN_GREETINGS = (
    "Hello?", "Yes, speaking.", "Hi, who's this?", "Hello, this is Maria.", "Yeah?", "Good morning.",
    "Hello, Smith residence.", "Hi there.", "Speaking.", "Hello, who is calling?",
)
MACHINE_GREETINGS = (
    "Hi, you've reached Sam. Leave a message.",
    "The person you are calling is not available. Please leave a message after the tone.",
    "Hello, you have reached the voicemail of John Smith. I can't take your call right now. "
    "Please leave your name, number and a short message, and I will call you back as soon as I can.",
    "Thanks for calling Green Valley Dental. Our office is closed. Please leave a message and we will "
    "return your call on the next business day.",
    "Hi, this is Anna. Sorry I missed you. Leave a message.",
    "You have reached the mailbox of extension two zero four. Please record your message at the tone. "
    "When you are finished, you may hang up or press pound for more options.",
    "Hey, it's Mike. I'm out right now, but leave a message and I'll get back to you.",
    "The wireless customer you are calling is not available at this time. Please try your call again "
    "later, or leave a message after the tone. To page this person, press five now.",
)
MACHINE_VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3")
BEEP_HZ = 1000.0
BEEP_S = 0.5


@dataclass(frozen=True)
class Greeting:
    name: str
    machine: bool
    #: 8 kHz line audio from the answer on.
    audio: np.ndarray
    #: Seconds from the answer to the greeting's first word, and to the end of its beep (machines).
    starts_at_s: float
    beep_ends_at_s: float | None = None


def line(audio_48k: np.ndarray, noise_dbfs: float | None, rng: np.random.Generator) -> np.ndarray:
    """48 kHz audio as the phone line delivers it at 8 kHz, with white noise under it."""
    if noise_dbfs is not None:
        audio_48k = audio_48k + (10 ** (noise_dbfs / 20) * rng.standard_normal(audio_48k.size)).astype(np.float32)
    out, narrow = LineDirection(48000, LINE_RATE).carry(audio_48k)
    return narrow


def beep(rate: int = 48000) -> np.ndarray:
    t = np.arange(int(rate * BEEP_S)) / rate
    return (0.3 * np.sin(2 * np.pi * BEEP_HZ * t)).astype(np.float32)


def quiet(seconds: float, rate: int = 48000) -> np.ndarray:
    return np.zeros(int(rate * seconds), np.float32)


def human(text: str, *, lead_s: float, noise_dbfs: float, rng: np.random.Generator, wait_s: float = 4.0) -> Greeting:
    audio = np.concatenate([quiet(lead_s), speak(text, 48000), quiet(wait_s)])
    return Greeting(f"human: {text!r}, noise {noise_dbfs:g} dBFS", False, line(audio, noise_dbfs, rng), lead_s)


def machine(text: str, voice: str, *, lead_s: float, rng: np.random.Generator, noise_dbfs: float | None = -60.0) -> Greeting:
    said = espeak(text, 48000, voice=voice)
    gap_s = 0.4
    audio = np.concatenate([quiet(lead_s), said, quiet(gap_s), beep(), quiet(3.0)])
    beep_end = lead_s + said.size / 48000 + gap_s + BEEP_S
    return Greeting(f"machine ({voice}, {said.size / 48000:.1f} s): {text[:40]!r}", True,
                    line(audio, noise_dbfs, rng), lead_s, beep_end)


def greeting_set(seed: int = 7) -> list[Greeting]:
    """Ten people at three levels of line noise and 32 voicemail greetings (8 texts, 4 voices)."""
    rng = np.random.default_rng(seed)
    clips = []
    for noise in (-50.0, -42.0, -36.0):
        for text in HUMAN_GREETINGS:
            clips.append(human(text, lead_s=float(rng.uniform(0.2, 1.0)), noise_dbfs=noise, rng=rng))
    for text in MACHINE_GREETINGS:
        for voice in MACHINE_VOICES:
            clips.append(machine(text, voice, lead_s=float(rng.uniform(0.2, 1.0)), rng=rng))
    return clips
