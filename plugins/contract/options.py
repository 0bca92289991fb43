"""A plugin's own settings, declared by the plugin and turned into flags by the worker.

A plugin sets ``options_type`` to a dataclass. Each field becomes a flag of the
subcommands that load a model (``--field-name``, also ``DUPLEX_FIELD_NAME`` in the
environment), shown in ``--help`` under the plugin's own heading; before
``build_local_engine`` the worker calls ``plugin.configure(options, max_sessions=N)``
with an instance holding the values given. A field's help, choices and secrecy come
from ``option()``::

    @dataclass
    class MyOptions:
        voice: str = option("alto", "the voice to speak in", choices=("alto", "bass"))
        api_key: str = option("", "the vendor's key", secret=True)
"""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any

HELP, CHOICES, SECRET = "help", "choices", "secret"


def option(default: Any, help: str, *, choices: tuple[str, ...] = (), secret: bool = False) -> Any:
    """A field of a plugin's options: its default, a one-line meaning, allowed values, and
    whether it is a secret (never shown in ``--help``, ``repr`` or logs)."""
    return field(default=default, repr=not secret, metadata={HELP: help, CHOICES: tuple(choices), SECRET: secret})


def option_help(f: Field) -> str:
    return str(f.metadata.get(HELP, ""))


def option_choices(f: Field) -> tuple[str, ...]:
    return tuple(f.metadata.get(CHOICES, ()))


def option_is_secret(f: Field) -> bool:
    return bool(f.metadata.get(SECRET, False))
