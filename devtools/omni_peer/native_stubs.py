"""Skip the native extensions of PyPI's torchvision/torchaudio (CUDA builds) in the peer's process.

vLLM imports both for their Python surfaces (transforms, types); the serving path never runs
their kernels. Their wheels are installed without dependencies, and loading their ``.so``
files against the CPU torch would fail, so their loaders are told there is nothing to load.
"""

from __future__ import annotations


def install() -> None:
    """Must run before anything imports torchvision or torchaudio."""
