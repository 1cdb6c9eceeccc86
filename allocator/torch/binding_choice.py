"""Which binding enable() makes torch's allocator: the torch-native one, or the pluggable fallback.

Owns: the binding option (``enable(binding=...)`` / ``VTALLOC_TORCH_BINDING``: "auto", "native"
or "pluggable", normalized once by :func:`binding_choice`), :class:`Binding` (what
``vt.binding()`` reports) and the one-time fallback warning (:class:`BindingFallbackWarning`).
Never imports torch; the torch module is passed in.
Invariants: "auto" never fails because the native binding cannot be had: it falls back to the
pluggable path and warns once per process with the reason and the fix; "native" raises
BackendUnavailableError with the reason; "pluggable" never builds anything. Preparing a binding
changes nothing of torch's: installing it is a separate step (:func:`install`), which
raises rather than falls back (torch's allocator may already be half set up).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from typing import Any, Callable, Mapping

from .. import _native
from . import binding_build as _torch_binding
from ..errors import InvalidArgumentError

__all__ = ["BINDINGS", "BINDING_ENV", "Binding", "BindingFallbackWarning", "binding_choice", "prepare", "install"]

log = logging.getLogger("vtalloc.allocator")

BINDINGS = ("auto", "native", "pluggable")
BINDING_ENV = "VTALLOC_TORCH_BINDING"


class BindingFallbackWarning(UserWarning):
    """enable() could not use the torch-native binding and fell back to the pluggable allocator."""


@dataclasses.dataclass(frozen=True)
class Binding:
    """How vtalloc is torch's allocator in this process (``vt.binding()``)."""

    kind: str | None                 # "native", "pluggable", or None before enable()
    reason: str | None = None        # why "auto" fell back to "pluggable" (None otherwise)
    library: str | None = None       # the native binding's library, or the core library (pluggable)
    torch_version: str | None = None
    build: float | str | None = None  # native: seconds the build took, or "cached"

    def describe(self) -> str:
        """One line for `vtalloc info`."""
        if self.kind is None:
            return "not enabled"
        if self.kind == "native":
            how = "cached build" if self.build == "cached" else f"built in {self.build} s"
            return f"native (torch {self.torch_version}, {how}): {self.library}"
        return "pluggable" + (f" (fallback: {self.reason})" if self.reason else "")


def binding_choice(value: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The binding asked for: ``value``, else $VTALLOC_TORCH_BINDING, else "auto"."""
    env = os.environ if environ is None else environ
    source = "binding"
    if value is None:
        value, source = env.get(BINDING_ENV) or "auto", BINDING_ENV
    if not isinstance(value, str) or value.strip().lower() not in BINDINGS:
        raise InvalidArgumentError(f"{source} must be one of {', '.join(BINDINGS)}, got {str(value)[:40]!r}")
    return value.strip().lower()


_warned = False


def _fallback_warning(reason: str) -> None:
    global _warned
    message = (f"vtalloc: using PyTorch's pluggable allocator interface, not the torch-native binding: {reason}. "
               "torch.cuda.memory_stats(), cudnn.benchmark, CUDA graphs and record_stream need the native binding "
               "(docs/torch.md); fix the cause above, or pass binding='pluggable' (VTALLOC_TORCH_BINDING=pluggable) "
               "to choose the fallback without this warning")
    log.warning("%s", message)
    if not _warned:
        _warned = True
        warnings.warn(message, BindingFallbackWarning, stacklevel=4)


def prepare(torch: Any, choice: str, build: Callable[[Any], tuple[Any, Any]] | None = None) -> tuple[Binding, Any]:
    """Build (or find cached) and load what ``choice`` needs: (the binding, the loaded native
    library or None). Nothing of torch's changes. "auto" falls back; "native" raises."""
    if choice == "pluggable":
        return Binding("pluggable", library=_native.library_path(), torch_version=torch.__version__), None
    try:
        path, seconds = (build or _torch_binding.build)(torch)
        lib = _torch_binding.load(path)
    except _torch_binding.BindingBuildError as e:
        if choice == "native":
            raise
        _fallback_warning(str(e.failure))
        return Binding("pluggable", reason=str(e.failure), library=_native.library_path(),
                       torch_version=torch.__version__), None
    return Binding("native", library=str(path), torch_version=torch.__version__, build=seconds), lib


def install(torch: Any, binding: Binding, lib: Any, pluggable: Callable[[], Any]) -> Any:
    """Make the prepared binding torch's allocator; returns the pluggable allocator object (None
    under the native binding: the binding's library keeps its allocator for the process)."""
    if binding.kind == "native":
        _torch_binding.install(lib)
        return None
    allocator = pluggable()
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


def reset_warning_for_tests() -> None:
    global _warned
    _warned = False
