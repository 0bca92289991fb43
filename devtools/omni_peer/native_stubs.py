"""Skip the native extensions of PyPI's torchvision/torchaudio (CUDA builds) in the peer's process.

vLLM and transformers import both for their Python surfaces; the serving path never runs
their kernels, and their ``.so`` files do not load against the CPU torch:

- torchvision registers fake kernels for its C++ operators at import
  (``torchvision._meta_registrations``), which fails when ``_C`` did not load; that module
  is replaced by an empty one (the operators stay unavailable, as they would be anyway);
- torchaudio loads ``_torchaudio``/``libtorchaudio`` at import (``torchaudio._extension``);
  that module is replaced by one that says the extension is absent, which torchaudio
  itself handles (its kernels then fail with a message if called).
"""

from __future__ import annotations

import sys
import types


def _fail_without_extension(*_, **__):
    raise RuntimeError("torchaudio's native extension is not loaded in the vLLM-Omni test peer")


def install() -> None:
    """Must run before anything imports torchvision or torchaudio."""
    vision = types.ModuleType("torchvision._meta_registrations")
    vision.__doc__ = "Stub (devtools.omni_peer.native_stubs): no fake kernels for unloaded operators."
    sys.modules.setdefault("torchvision._meta_registrations", vision)

    audio = types.ModuleType("torchaudio._extension")
    audio.__doc__ = "Stub (devtools.omni_peer.native_stubs): the native extension is absent."
    audio._IS_TORCHAUDIO_EXT_AVAILABLE = False
    audio._IS_ALIGN_AVAILABLE = False
    audio.fail_if_no_align = lambda function: _fail_without_extension
    audio._check_cuda_version = lambda: None
    sys.modules.setdefault("torchaudio._extension", audio)
