"""Count the torch shim's calls across ctypes, by entry point name.

Owns: :func:`count_shim_calls`, which puts a counting stand-in in front of the shim's library
for one test (``shim.lib()`` is what every wrapper of allocator/torch/shim.py calls).
Invariants: every attribute read of a counted name is one call (the wrappers read the function
and call it at once); the real library still does the work, so what the call returns is real.
"""

from __future__ import annotations

from typing import Any

import pytest

from vtalloc.allocator.torch import shim

# The entry points that carry the torch allocator's options.
CONFIG_CALLS = ("vta_torch_configure", "vta_torch_get_config", "vta_torch_normalize_config")


def count_shim_calls(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] = CONFIG_CALLS) -> list[str]:
    """The names of ``names`` the shim's wrappers call from now on, in order, one entry per call."""
    real = shim.lib()
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            if name in names:
                calls.append(name)
            return getattr(real, name)

    counting = Counting()
    monkeypatch.setattr(shim, "lib", lambda: counting)
    return calls
