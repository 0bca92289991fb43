"""bench.asr_accuracy's scoring (word error rate) and its phone line."""

from __future__ import annotations

import numpy as np
import pytest

from bench.wer import error_rate, normalise, word_errors
from devtools.speech import phone_line


def test_only_a_change_of_words_counts():
    assert word_errors("Book a table for two at seven.", "book a table for 2 at 7") == (0, 7)
    assert word_errors("What's the time?", "What is the time") == (0, 4)
    assert normalise("Quel temps fait-il à Paris aujourd'hui?") == [
        "quel", "temps", "fait", "il", "à", "paris", "aujourd'hui"]


def test_substitutions_deletions_and_insertions_each_count_one():
    assert word_errors("transfer me to billing please", "transfer meter billing please") == (2, 5)
    assert word_errors("call me back", "") == (3, 3)
    assert word_errors("call me back", "please call me back now") == (2, 3)
    # "2.7" is the two numbers Whisper heard for "two at seven": "at" is missing.
    assert word_errors("for two at seven", "for 2.7") == (1, 4)


def test_the_rate_is_over_all_the_words():
    assert error_rate([("one two three", "one two three"), ("a b", "a c")]) == pytest.approx(1 / 5)


def test_the_phone_line_is_narrow_band_and_the_same_each_time():
    rate = 16000
    t = np.arange(rate) / rate
    tones = (0.3 * np.sin(2 * np.pi * 1000 * t) + 0.3 * np.sin(2 * np.pi * 6000 * t)).astype(np.float32)
    line = phone_line(tones, rate, seed=7)
    assert np.array_equal(line, phone_line(tones, rate, seed=7))
    spectrum = np.abs(np.fft.rfft(line))
    freqs = np.fft.rfftfreq(line.size, 1 / rate)
    in_band = spectrum[np.abs(freqs - 1000) < 20].max()
    assert spectrum[np.abs(freqs - 6000) < 20].max() < in_band / 100
    assert 0.1 < np.sqrt(np.mean(line**2)) < 0.4  # the speech keeps its level
