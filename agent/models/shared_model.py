"""Models load once per process and are shared by every session."""

from __future__ import annotations

import threading
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="SharedModel")


class SharedModel:
    """Base for a model class: ``cls.shared()`` is its process-wide instance, built on first use."""

    _instances: ClassVar[dict[type, Any]] = {}
    _loading: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def shared(cls: type[T]) -> T:
        with SharedModel._loading:
            instance = SharedModel._instances.get(cls)
            if instance is None:
                instance = SharedModel._instances[cls] = cls()
            return instance
