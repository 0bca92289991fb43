"""Which Whisper hears the caller: --asr-model and --asr-language, checked at start."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from devtools.speech import espeak
from duplex_agent.agent.app.settings import read_environment
from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.plugins.reference.asr import DEFAULT_ASR_MODEL, WhisperRecognizer
from duplex_agent.plugins.reference.plugin import ReferenceOptions, ReferencePlugin


def configured(**environment: str) -> ReferencePlugin:
    options = ReferenceOptions()
    read_environment(options, environment)
    plugin = ReferencePlugin(as_float32_audio)
    plugin.configure(options, max_sessions=1)
    return plugin


def test_base_is_the_default_and_tiny_en_is_a_choice():
    assert DEFAULT_ASR_MODEL == "base"
    assert (configured().asr_model, configured().asr_language) == ("base", "en")
    plugin = configured(DUPLEX_ASR_MODEL="tiny.en")
    assert (plugin.asr_model, plugin.asr_language) == ("tiny.en", "en")
    assert configured(DUPLEX_ASR_LANGUAGE="de").asr_language == "de"


@pytest.mark.parametrize("environment, says", [
    ({"DUPLEX_ASR_MODEL": "tiny.en", "DUPLEX_ASR_LANGUAGE": "de"}, "English only"),
    ({"DUPLEX_ASR_LANGUAGE": "klingon"}, "no language 'klingon'"),
    ({"DUPLEX_ASR_MODEL": "large"}, "unknown Whisper model 'large'"),
])
def test_a_choice_that_cannot_work_stops_the_start_in_one_line(environment, says):
    with pytest.raises(ModelStartError, match=says):
        configured(**environment)


def test_the_models_are_shared_per_model_and_language():
    assert WhisperRecognizer.shared() is WhisperRecognizer.shared("base", "en")
    assert WhisperRecognizer.shared("tiny.en") is not WhisperRecognizer.shared("base")


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
@pytest.mark.parametrize("voice", ["en-us", "en-gb+f3"])
def test_base_hears_a_plain_question_word_for_word(voice):
    """tiny.en heard this question in en-gb+f3 as "What is that whenever I can, Paris to me?"."""
    text = "What is the weather like in Paris today?"
    clip = np.concatenate([np.zeros(4800, np.float32), espeak(text, voice=voice), np.zeros(4800, np.float32)])
    heard = WhisperRecognizer.shared("base").transcribe(clip)
    assert heard.strip(" .?").lower() == text.strip("?").lower(), heard
