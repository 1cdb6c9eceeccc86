"""vtalloc as PyTorch's CUDA allocator: ``enable()`` for the whole process, ``mempool()`` for scopes.

Owns: the process's choice of how torch uses vtalloc (one of: not at all, the global allocator
through ``torch.cuda.memory.change_current_allocator``, or the allocator of
``torch.cuda.MemPool`` objects; kept in ``process_mode.state`` with the options in force and the
CUDAPluggableAllocator object, alive for the life of the process: torch's MemPool holds a raw
pointer to it), and the ``record_stream`` guard under the pluggable binding. torch is imported
inside functions only, so ``import vtalloc.allocator`` never imports it. The options' defaults are the shim's:
this module only refuses what the torch API does not take, and the options cross into the shim
once to be applied (``shim.configure`` returns what it keeps); they are only normalized without
being applied (``shim.normalized``) to be compared with options already in force, or for
:func:`resolve_config`.

Invariants: one vtalloc configuration per process (the shim has one address space per device);
``enable()`` and ``mempool()`` exclude each other (enable() replaces the caching allocator that
MemPools live in); a call that cannot do what it says raises a typed error and changes nothing.
How failures reach the user, and what works with which torch feature, is in docs/torch.md.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import _native
from ..config import Config
from ..errors import BackendUnavailableError, InvalidArgumentError
from ..probe import backend_available
from ..publish import publish_from_env
from . import binding_choice as _torch_install
from . import shim as _torch_shim
from .binding_choice import Binding
from .memory import TORCH_VIEW as _TORCH_VIEW
from .process_mode import GLOBAL, MEMPOOL, AllocatorConflictError, UnsupportedError
from .process_mode import describe as _describe
from .process_mode import import_torch as _torch
from .process_mode import lock as _lock
from .process_mode import state as _state

__all__ = ["enable", "is_enabled", "mode", "binding", "mempool", "resolve_config"]

log = logging.getLogger("vtalloc.allocator")


def resolve_config(**config: Any) -> Config:
    """The options for torch's allocator: ``VTALLOC_*`` variables, then keyword arguments (which win).

    The torch allocator serves every CUDA device (one address space each), so ``device`` is
    not an option here and ``VTALLOC_DEVICE`` is ignored; the backend is always cuda (the shim
    normalizes both: what is returned is what it keeps).
    """
    return _torch_shim.normalized(_requested(**config))


def _requested(**config: Any) -> Config:
    """The options as asked (``VTALLOC_*`` variables, then keyword arguments), with what the torch
    API does not take refused; not yet normalized by the shim (nothing crosses into it here)."""
    if "device" in config:
        raise InvalidArgumentError(
            "device is not an option of the torch allocator: it serves every CUDA device, one address space each"
        )
    cfg = Config.from_env(**config)
    if cfg.backend == "host":
        raise InvalidArgumentError(
            "torch's CUDA allocator needs the cuda backend (host memory cannot back CUDA tensors); "
            "for CPU tensors over a host space use AddressSpace(backend='host').tensor(...)"
        )
    return cfg


def _require_cuda(torch: Any) -> None:
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise BackendUnavailableError(
            f"no CUDA device for PyTorch here: torch {torch.__version__} ({build}) reports torch.cuda.is_available() "
            "== False; vtalloc's torch allocator needs a CUDA GPU"
        )
    ok, why = backend_available("cuda")
    if not ok:
        raise BackendUnavailableError(f"vtalloc's cuda backend cannot run here: {why}")


def _pluggable(torch: Any) -> Any:
    return torch.cuda.memory.CUDAPluggableAllocator(_native.library_path(), "vta_torch_alloc", "vta_torch_free")



def enable(binding: str | None = None, **config: Any) -> Config:
    """Make vtalloc PyTorch's CUDA allocator for this process; returns the options in force.

    Options are those of :class:`~vtalloc.allocator.Config` except ``backend``/``device``
    (``capacity``, ``page_size``, ...), per device, from keyword arguments or ``VTALLOC_*``
    variables. Call it before CUDA is first used (before the first CUDA tensor). Calling it
    again with the same options does nothing; with other options it raises.

    ``binding`` (or ``VTALLOC_TORCH_BINDING``): "auto" (the default) uses the torch-native
    binding, built once for this torch, and falls back to PyTorch's pluggable allocator with
    one BindingFallbackWarning saying why when it cannot be had; "native" raises
    BackendUnavailableError instead; "pluggable" never builds. :func:`binding` says which is in force.
    """
    choice = _torch_install.binding_choice(binding)
    requested = _requested(**config)
    with _lock:
        if _state.mode == GLOBAL:
            cfg = _torch_shim.normalized(requested)
            if cfg == _state.config and (binding is None or choice in ("auto", _state.binding.kind)):
                return cfg
            raise AllocatorConflictError(
                f"vtalloc is already torch's allocator ({_state.binding.kind} binding) with options "
                f"({_describe(_state.config)}); it cannot switch to ({_describe(cfg)}, binding={choice}) in a "
                "running process"
            )
        if _state.mode == MEMPOOL:
            raise AllocatorConflictError(
                "mempool() is in use in this process: enable() would replace the caching allocator its MemPools live "
                "in. Use either enable() or mempool() in one process"
            )
        torch = _torch()
        _require_cuda(torch)
        _require_uninitialized(torch)
        chosen, lib = _torch_install.prepare(torch, choice)
        if chosen.kind == "pluggable" and torch.backends.cudnn.benchmark:
            raise AllocatorConflictError(
                "torch.backends.cudnn.benchmark is True, which needs the allocator's cacheInfo that PyTorch's pluggable "
                "allocator does not provide: set it to False before enable()"
                + (f" (the torch-native binding, which provides it, is unavailable: {chosen.reason})"
                   if chosen.reason else "")
            )
        cfg = _torch_shim.configure(requested, _torch_shim.FAIL_THROW)  # normalized, applied, as kept
        publish_from_env(_TORCH_VIEW)  # VTALLOC_PUBLISH_STATS: `vtalloc stats --pid` sees torch's memory
        try:
            allocator = _torch_install.install(torch, chosen, lib, lambda: _pluggable(torch))
        except RuntimeError as e:
            _torch_shim.release()  # no space exists yet: back to the defaults, nothing changed
            raise AllocatorConflictError(
                "PyTorch's CUDA allocator is already initialized (CUDA memory was allocated): call "
                f"vtalloc.allocator.torch.enable() before the first CUDA tensor. torch said: {e}"
            ) from None
        except BaseException:
            _torch_shim.release()
            raise
        _state.mode, _state.config, _state.allocator, _state.binding = GLOBAL, cfg, allocator, chosen
        if chosen.kind == "pluggable":
            _guard_record_stream(torch)  # the native binding implements record_stream
        log.info("vtalloc is torch's CUDA allocator (%s binding): %s", chosen.kind, _describe(cfg))
    return cfg


def _require_uninitialized(torch: Any) -> None:
    if torch.cuda.is_initialized():
        raise AllocatorConflictError(
            "CUDA is already initialized in this process, so PyTorch's allocator is fixed: call "
            "vtalloc.allocator.torch.enable() before the first CUDA tensor (or any call that initializes CUDA)"
        )


def binding() -> Binding:
    """Which binding makes vtalloc torch's allocator in this process: kind "native" (the
    torch-native binding: library, torch version, build seconds or "cached"), "pluggable" (with
    the reason when "auto" fell back), or None before enable()."""
    return _state.binding or Binding(None)


def is_enabled() -> bool:
    """True once enable() made vtalloc torch's allocator in this process."""
    return _state.mode == GLOBAL


def mode() -> str | None:
    """How torch uses vtalloc in this process: None, "global" (enable) or "mempool"."""
    return _state.mode


def mempool(**config: Any) -> Any:
    """A new ``torch.cuda.MemPool`` whose segments come from vtalloc, for ``torch.cuda.use_mem_pool(pool)``.

    PyTorch's caching allocator still splits and caches blocks inside the pool; vtalloc serves
    the segments (and gets them back on OOM or when the pool dies). Options as for enable();
    every pool of the process shares them.
    """
    requested = _requested(**config)
    with _lock:
        if _state.mode == GLOBAL:
            hint = ("; under its native binding torch.cuda.MemPool() itself gives a vtalloc pool"
                    if _state.binding is not None and _state.binding.kind == "native" else "")
            raise AllocatorConflictError(
                "enable() made vtalloc torch's global allocator, which replaced the caching allocator MemPools need; "
                f"use either enable() or mempool() in one process{hint}"
            )
        if _state.mode == MEMPOOL:
            asked = _torch_shim.normalized(requested)
            if asked != _state.config:
                raise AllocatorConflictError(
                    f"vtalloc pools in this process use options ({_describe(_state.config)}); a pool with "
                    f"({_describe(asked)}) cannot be made: one vtalloc configuration per process"
                )
        torch = _torch()
        if not hasattr(torch.cuda, "MemPool"):  # pyproject admits torch 2.3, for enable(): see docs/torch.md
            raise UnsupportedError(
                f"mempool() needs torch.cuda.MemPool, new in PyTorch 2.5; this is PyTorch {torch.__version__}. "
                "Upgrade torch, or use enable() (PyTorch 2.3 and newer)")
        _require_cuda(torch)
        if _state.mode is None:
            cfg = _torch_shim.configure(requested, _torch_shim.FAIL_RETURN_NULL)  # normalized, applied, as kept
            publish_from_env(_TORCH_VIEW)
            try:
                _state.allocator = _pluggable(torch)
            except BaseException:
                _torch_shim.release()  # no space exists yet: back to the defaults
                raise
            _state.mode, _state.config = MEMPOOL, cfg
            log.info("vtalloc serves torch MemPools: %s", _describe(cfg))
        return torch.cuda.MemPool(_state.allocator.allocator())


# -- record_stream ---------------------------------------------------------------------------

def _record_stream_unsupported(tensor: Any, stream: Any) -> None:
    if getattr(tensor, "is_cuda", False):
        raise UnsupportedError(
            "Tensor.record_stream() does nothing under PyTorch's pluggable allocator (it has no Python hook), so with "
            "vtalloc as the global allocator the memory could be reused while the other stream still uses it. "
            "Instead, before dropping the tensor, make the stream that allocated it wait for this one: "
            "alloc_stream.wait_stream(stream) (usually torch.cuda.current_stream().wait_stream(stream))"
        )
    return _state.original_record_stream(tensor, stream)


def _guard_record_stream(torch: Any) -> None:
    if _state.original_record_stream is None:
        _state.original_record_stream = torch.Tensor.record_stream
        torch.Tensor.record_stream = _record_stream_unsupported
