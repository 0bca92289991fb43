"""Identifier helpers (LiveKit sids carry a type prefix the SDK validates)."""

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


def new_sid(prefix: str) -> str:
    # e.g. "PA_", "TR_", "RM_", "AJ_", "AW_", "AD_"
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(12))
