"""The scripted model: what the thinker says and what code2wav plays, deterministic per reply.

Reply ``n`` of a conversation (``n`` = the number of user turns in the prompt) says
``"reply n <words>"``; each word is a tone of ``REPLY_TONE_HZ(n)`` for ``WORD_S`` then
``GAP_S`` of silence, so a test can tell replies apart by their pitch and count their words.
Pure numpy: this module does not import vLLM-Omni.
"""

from __future__ import annotations

import json

import numpy as np

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")
WORD_S = 0.24
GAP_S = 0.06
AMPLITUDE = 0.3


def reply_tone_hz(reply_index: int) -> float:
    """The pitch of reply ``n`` (1-based): 300, 450, ... 1050 Hz, then round again."""
    return 300.0 + 150.0 * ((max(reply_index, 1) - 1) % 6)


def render_prompt(messages: list[dict]) -> str:
    """What the scripted chat template renders: the messages as JSON, media as placeholders."""
    rendered = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = [part.get("text", "") if part.get("type") == "text" else f"<{part.get('type')}>"
                     for part in content if isinstance(part, dict)]
        else:
            parts = [str(content or "")]
        rendered.append({"role": message.get("role", ""), "parts": parts})
    return json.dumps(rendered)


def prompt_messages(prompt: str) -> list[dict]:
    """The messages a rendered prompt holds (``render_prompt`` read back)."""
    try:
        messages = json.loads(prompt)
    except (TypeError, ValueError):
        return []
    return [message for message in messages if isinstance(message, dict)] if isinstance(messages, list) else []


def reply_text(prompt: str, *, word_count: int = 3) -> tuple[int, str]:
    """(reply index, text) for a rendered prompt: the index counts its user turns."""
    user_turns = sum(1 for message in prompt_messages(prompt) if message.get("role") == "user")
    index = max(user_turns, 1)
    words = [WORDS[(index + i - 1) % len(WORDS)] for i in range(max(word_count, 1))]
    return index, f"reply {index} " + " ".join(words)


def word_audio(reply_index: int, sample_rate: int) -> np.ndarray:
    """One word's audio: a tone at the reply's pitch, then silence (float32 in [-1, 1])."""
    tone_samples = int(round(WORD_S * sample_rate))
    t = np.arange(tone_samples, dtype=np.float64) / sample_rate
    tone = AMPLITUDE * np.sin(2 * np.pi * reply_tone_hz(reply_index) * t)
    ramp = min(tone_samples // 10, int(0.005 * sample_rate))
    if ramp:
        envelope = np.linspace(0.0, 1.0, ramp)
        tone[:ramp] *= envelope
        tone[-ramp:] *= envelope[::-1]
    gap = np.zeros(int(round(GAP_S * sample_rate)))
    return np.concatenate([tone, gap]).astype(np.float32)


class ScriptedChatProcessor:
    """Stands in for the checkpoint's HF processor, which the plugin only asks for a chat template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        return render_prompt(list(messages))
