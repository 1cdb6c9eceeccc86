"""vtalloc as PyTorch's CUDA allocator: ``enable()`` for the whole process, ``mempool()`` for scopes.

Owns: the process's choice of how torch uses vtalloc (one of: not at all, the global allocator
through ``torch.cuda.memory.change_current_allocator``, or the allocator of
``torch.cuda.MemPool`` objects; kept in ``_torch_mode.state`` with the options in force and the
CUDAPluggableAllocator object, alive for the life of the process: torch's MemPool holds a raw
pointer to it), and the statistics in PyTorch's vocabulary. torch is imported inside functions
only, so ``import vtalloc.allocator`` never imports it. The options' defaults are the shim's
(``_torch_shim.normalized``); this module only refuses what the torch API does not take.

Invariants: one vtalloc configuration per process (the shim has one address space per device);
``enable()`` and ``mempool()`` exclude each other (enable() replaces the caching allocator that
MemPools live in); a call that cannot do what it says raises a typed error and changes nothing.
How failures reach the user, and what works with which torch feature, is in docs/torch.md.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

from . import _native, _torch_install, _torch_shim
from . import _torch_stats as _stats
from ._torch_mode import GLOBAL, MEMPOOL, AllocatorConflictError, UnsupportedError
from ._torch_install import Binding, BindingFallbackWarning
from ._torch_mode import lock as _lock
from ._torch_mode import state as _state
from ._torch_shim import OomBinding
from .config import Config, format_size
from .errors import BackendUnavailableError, InvalidArgumentError
from .probe import backend_available
from .paged_activations import PagedActivations, PagedStats, paged_activations
from .publish import publish_from_env
from .publish import publish_stats as _publish
from .stats import Stats

__all__ = [
    "enable", "is_enabled", "mode", "binding", "Binding", "BindingFallbackWarning", "mempool", "resolve_config",
    "stats", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_accumulated_memory_stats", "mem_get_info", "memory_summary", "empty_cache", "failures", "oom_exception",
    "oom_binding", "OomBinding",
    "AllocatorConflictError", "UnsupportedError",
    "paged_activations", "PagedActivations", "PagedStats", "offload", "prefetch", "publish_stats",
]


log = logging.getLogger("vtalloc.allocator")


def _torch() -> Any:
    import torch  # deferred on purpose: importing vtalloc.allocator must not import torch

    return torch


def resolve_config(**config: Any) -> Config:
    """The options for torch's allocator: ``VTALLOC_*`` variables, then keyword arguments (which win).

    The torch allocator serves every CUDA device (one address space each), so ``device`` is
    not an option here and ``VTALLOC_DEVICE`` is ignored; the backend is always cuda (the shim
    normalizes both: what is returned is what it keeps).
    """
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
    return _torch_shim.normalized(cfg)


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


def _describe(cfg: Config | None) -> str:
    if cfg is None:
        return "none"
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("backend", "device")}
    return ", ".join(f"{k}={format_size(v) if isinstance(v, int) else v}" for k, v in fields.items() if v is not None) or "defaults"


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
    cfg = resolve_config(**config)
    with _lock:
        if _state.mode == GLOBAL:
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
        _torch_shim.configure(cfg, _torch_shim.FAIL_THROW)
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
    cfg = resolve_config(**config)
    with _lock:
        if _state.mode == GLOBAL:
            hint = ("; under its native binding torch.cuda.MemPool() itself gives a vtalloc pool"
                    if _state.binding is not None and _state.binding.kind == "native" else "")
            raise AllocatorConflictError(
                "enable() made vtalloc torch's global allocator, which replaced the caching allocator MemPools need; "
                f"use either enable() or mempool() in one process{hint}"
            )
        if _state.mode == MEMPOOL and cfg != _state.config:
            raise AllocatorConflictError(
                f"vtalloc pools in this process use options ({_describe(_state.config)}); a pool with "
                f"({_describe(cfg)}) cannot be made: one vtalloc configuration per process"
            )
        torch = _torch()
        if not hasattr(torch.cuda, "MemPool"):  # pyproject admits torch 2.3, for enable(): see docs/torch.md
            raise UnsupportedError(
                f"mempool() needs torch.cuda.MemPool, new in PyTorch 2.5; this is PyTorch {torch.__version__}. "
                "Upgrade torch, or use enable() (PyTorch 2.3 and newer)")
        _require_cuda(torch)
        if _state.mode is None:
            _torch_shim.configure(cfg, _torch_shim.FAIL_RETURN_NULL)
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


# -- statistics ----------------------------------------------------------------------------
# ``device`` of the PyTorch-named functions is read as torch.cuda reads it: an ordinal, "cuda",
# "cuda:N", a torch.device, or None for the current device (torch.cuda.current_device(), 0
# before CUDA is initialized; it is never initialized here). vtalloc adds "all": every device
# the allocator serves, summed (peaks: the sum of per-device peaks).

def stats(device: Any = _stats.ALL) -> Stats:
    """vtalloc's Stats of the torch allocator: summed over every device it serves ("all", the
    default), or one device (an ordinal, "cuda:N", a torch.device; None: the current one).

    Summed peaks are the sum of each device's peak. page_bytes and small_threshold_bytes are
    per-device settings: the largest is reported. All zero before the first allocation.
    """
    return _stats.sum_stats([_torch_shim.device_stats(d) for d in _stats.device_list(device)])


def memory_stats(device: Any = None) -> dict[str, int]:
    """Statistics under torch.cuda.memory_stats() key names where the meaning is the same.

    - ``allocated_bytes.all.{current,peak}``: live allocations as the allocator rounded them
      (whole 512 B blocks): vtalloc's active bytes;
    - ``requested_bytes.all.{current,peak}``: live allocations as requested;
    - ``active_bytes.all.current``: allocated plus freed memory still waiting for its stream;
    - ``reserved_bytes.all.{current,peak}``: physical pages held (mapped or not);
    - ``allocation.all.{current,allocated,freed}``, ``num_ooms``, ``num_device_alloc`` /
      ``num_device_free`` (page map / unmap calls).
    Keys that start with ``vtalloc.`` have no PyTorch counterpart. ``device``: as torch's (None:
    the current device), or "all" (summed over devices; peaks: the sum of per-device peaks).
    """
    return _stats.flat_stats(_stats.device_list(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """:func:`memory_stats` as nested dicts (``["allocated_bytes"]["all"]["peak"]``), as torch's."""
    return _stats.nested(memory_stats(device))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    """The most bytes of physical pages held at once since the start or the last peak reset."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def _peak_device(device: Any) -> int | None:
    return None if isinstance(device, str) and device == _stats.ALL else _stats.device_index(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Peaks (allocated, requested, reserved, mapped) restart from the current values."""
    _torch_shim.reset_peak_stats(_peak_device(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """As torch's: resets *every* peak (it calls :func:`reset_peak_memory_stats`). Unlike torch,
    it emits no FutureWarning: vtalloc has no older behaviour to warn about."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Restart the accumulated counts from zero: ``allocation.all.allocated`` / ``freed``,
    ``num_ooms``, ``num_device_alloc`` / ``free`` and vtalloc's historical counters (page
    reclaims, failures), as memory_stats() reports them. :func:`stats` and :func:`failures` keep
    the allocator's own counts."""
    for d in _stats.device_list(device):
        _stats.reset_accumulated(d)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes as the vtalloc allocator sees the device: total is the capacity of its
    address space there, free what it may still take (capacity less the pages it holds), no more
    than the driver's free memory once CUDA is initialized. Before the device's space exists:
    the configured capacity, or, with none configured, the driver's answer
    (torch.cuda.mem_get_info) where CUDA is initialized, else (0, 0).

    torch.cuda.mem_get_info() stays the driver's view of the whole GPU (every process)."""
    d = _stats.device_index(device)
    s = _torch_shim.device_stats(d)
    torch = sys.modules.get("torch")
    driver = torch.cuda.mem_get_info(d) if torch is not None and torch.cuda.is_initialized() else None
    if s.capacity_bytes:
        total = s.capacity_bytes
        free = total - s.pages_total * s.page_bytes
    else:
        is_configured, _, options = _torch_shim.current_config()
        configured = options["capacity_bytes"] if is_configured else 0
        if not configured:
            return (int(driver[0]), int(driver[1])) if driver else (0, 0)
        free = total = configured
    return (min(free, int(driver[0])) if driver else free), total


def empty_cache(device: Any = _stats.ALL) -> int:
    """Unmap cached pages and give unused pages back to the driver; returns the bytes released.

    ``torch.cuda.empty_cache()`` does nothing under a pluggable allocator: call this instead.
    Like it, by default it covers every device ("all"); a ``device`` argument narrows it to one.
    """
    return _torch_shim.trim(_peak_device(device))


def failures(device: Any = 0) -> _torch_shim.Failures:
    """What the allocator could not do on ``device``: counts and the last message (OOM numbers included)."""
    return _torch_shim.failures(_stats.device_index(device))


def oom_exception() -> str:
    """Which Python exception an out-of-memory under enable() becomes in this process.

    "torch.OutOfMemoryError" when vtalloc could bind to the torch it runs with, else
    "RuntimeError" (the fallback, with the same message). Imports torch first, as enable()
    does; :func:`oom_binding` says how it bound, or why not.
    """
    _torch()  # bind against the torch this process uses
    return oom_binding().exception


def oom_binding() -> OomBinding:
    """How an out-of-memory under enable() is bound to ``c10::OutOfMemoryError`` in this process
    now: the route ("constructor" or "base+vtable"), torch's std::string ABI, the torch libraries
    the symbols came from, or why it is not (then the exception is RuntimeError).

    Unlike :func:`oom_exception` it does not import torch: it reports the process as it is.
    """
    return _torch_shim.oom_binding()


def memory_summary(device: Any = _stats.ALL) -> str:
    """A human-readable table of the torch allocator's memory: by default of every device it
    serves and their total ("all"), or of the one ``device`` names (None: the current one)."""
    devs = _stats.device_list(device)
    header = f"vtalloc torch allocator ({_state.mode or 'not enabled'}" + (
        f"; {_describe(_state.config)})" if _state.config else ")")
    if not devs:
        return header + "\nno device has allocated through vtalloc yet\n"
    rows = [("metric", *[f"cuda:{d}" for d in devs])]
    if len(devs) > 1:
        rows[0] = (*rows[0], "total")
    per = [memory_stats(d) for d in devs]
    total = memory_stats(_stats.ALL) if len(devs) > 1 else None
    metrics = [
        ("allocated (rounded)", "allocated_bytes.all.current", True),
        ("allocated, peak", "allocated_bytes.all.peak", True),
        ("requested", "requested_bytes.all.current", True),
        ("reserved (pages held)", "reserved_bytes.all.current", True),
        ("mapped", "vtalloc.mapped_bytes.current", True),
        ("mapped, peak", "vtalloc.mapped_bytes.peak", True),
        ("cached (mapped, free)", "vtalloc.cached_bytes.current", True),
        ("waiting for streams", "vtalloc.pending_free_bytes.current", True),
        ("capacity", "vtalloc.capacity_bytes", True),
        ("page size", "vtalloc.page_bytes", True),
        ("live allocations", "allocation.all.current", False),
        ("allocations / frees", None, False),
        ("page reclaims", "vtalloc.num_page_reclaims", False),
        ("OOMs", "num_ooms", False),
        ("alloc failures", "vtalloc.alloc_failures", False),
        ("free failures", "vtalloc.free_failures", False),
    ]
    for label, key, is_bytes in metrics:
        cells = []
        for m in per + ([total] if total else []):
            if key is None:
                cells.append(f"{m['allocation.all.allocated']} / {m['allocation.all.freed']}")
            else:
                cells.append(format_size(m[key]) if is_bytes else str(m[key]))
        if total and label == "page size":
            cells[-1] = ""
        rows.append((label, *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [header]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _storage_of(tensor: Any) -> int:
    """The allocation behind a tensor: its storage's start."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.untyped_storage().data_ptr()


def _residency(tensor: Any, space: Any, op: int, wait: bool = False) -> None:
    address = _storage_of(tensor)
    if space is not None:  # a tensor made by space.tensor()
        {_torch_shim.OP_OFFLOAD: space.offload,
         _torch_shim.OP_PREFETCH: space.ensure_resident if wait else space.prefetch}[op](address)
        return
    if not tensor.is_cuda or _state.mode != GLOBAL:
        raise InvalidArgumentError(
            "without a space, offload()/prefetch() take CUDA tensors allocated by vtalloc as torch's allocator "
            "(enable()); for tensors made by space.tensor(), pass the space"
        )
    device = tensor.device.index or 0
    if op == _torch_shim.OP_PREFETCH:
        stream = _torch().cuda.current_stream(device).cuda_stream
        _torch_shim.residency_op(device, _torch_shim.OP_ENSURE_RESIDENT if wait else op, address, stream)
    else:
        _torch_shim.residency_op(device, op, address)


def offload(tensor: Any, space: Any = None) -> None:
    """Start evicting ``tensor``'s pages to host memory, in place: same storage, same address.

    ``space``: the AddressSpace a ``space.tensor()`` lives in; ``None`` for a CUDA tensor under
    ``enable()``. Do not write the tensor until :func:`prefetch` (``wait=True``) brought it back.
    """
    _residency(tensor, space, _torch_shim.OP_OFFLOAD)


def prefetch(tensor: Any, space: Any = None, wait: bool = False) -> None:
    """Start restoring ``tensor``'s pages (``wait=True``: block until resident); on CUDA the
    current stream is ordered after the copies."""
    _residency(tensor, space, _torch_shim.OP_PREFETCH, wait)


class _TorchSpacesView:
    """What the stats publisher sees of the spaces serving torch: their Stats summed over devices."""

    backend, device, closed, leased, name = "cuda", _torch_shim.ALL_DEVICES, False, False, "torch"

    def stats(self) -> Stats:
        return stats()

    def published_parts(self) -> list[tuple[str, int, Stats]]:
        """One row per device with a space, named as torch names the device (``torch:cuda:0``)."""
        return [(f"torch:cuda:{d}", d, _torch_shim.device_stats(d)) for d in _torch_shim.devices()]


_TORCH_VIEW = _TorchSpacesView()  # module-lifetime: the publisher holds it by weak reference


def publish_stats(interval_s: float = 1.0) -> None:
    """Publish the torch allocator's stats for ``vtalloc stats --pid`` (as VTALLOC_PUBLISH_STATS=1
    does at enable()/mempool())."""
    _publish(_TORCH_VIEW, name="torch", interval_s=interval_s)
