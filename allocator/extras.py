"""The optional dependencies: torch and cuda-python, imported only where they are needed.

Owns: :func:`import_torch` and :func:`import_cuda_driver`, the only places vtalloc imports
them, and the message that says how to install each (:data:`TORCH_INSTALL`).
Invariants: a missing package is a :class:`MissingDependencyError` (also an ``ImportError``)
that names the extra (``vtalloc[torch]``, ``vtalloc[cuda]``) and the way to bring one's own;
nothing here imports either package at module import, so ``import vtalloc.allocator``, the
daemon and the CLI work without them (a plain ``pip install vtalloc`` installs neither).
"""

from __future__ import annotations

from typing import Any

from .errors import MissingDependencyError

__all__ = ["TORCH_INSTALL", "CUDA_INSTALL", "import_torch", "import_cuda_driver"]

TORCH_INSTALL = ("pip install 'vtalloc[torch]' (PyPI's torch: a CUDA build, several GB on Linux), or install your "
                 "own torch (CPU only: pip install torch --index-url https://download.pytorch.org/whl/cpu)")
CUDA_INSTALL = "pip install 'vtalloc[cuda]' (NVIDIA's cuda-python)"


def import_torch(purpose: str = "vtalloc's torch integration") -> Any:
    """The torch module, or MissingDependencyError saying that ``purpose`` needs it and how to get it."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise  # torch is there but broken: its own error says more
        raise MissingDependencyError(f"{purpose} needs torch, which is not installed: {TORCH_INSTALL}") from None
    return torch


def import_cuda_driver(purpose: str = "reading the CUDA driver's device information") -> Any:
    """cuda-python's driver module (``cuda.bindings.driver``), or MissingDependencyError."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs cuda-python, which is not installed ({e}): {CUDA_INSTALL}") \
            from None
    return driver
