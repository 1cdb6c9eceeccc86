"""vtalloc as PyTorch's CUDA allocator, and the torch glue over the allocator core.

Owns: the public face of the torch glue (``import vtalloc.allocator.torch as vt``): the names
below, re-exported from the modules that own them, one concept each:
``enabling`` (enable() / mempool(): how torch uses vtalloc in this process), ``memory``
(statistics and maintenance under torch.cuda's names), ``failure_reports`` (what the allocator
could not do, and how an out-of-memory reaches Python), ``offloading`` (offload / prefetch of a
tensor), ``activation_paging`` (saved activations kept, paged to host or recomputed: the
schedule), with ``activation_pagers`` (where paged ones live), ``activation_room`` (room made in
the space when it has none, what a step needs), ``activation_hooks`` (the hooks as torch.compile
must see them), ``activation_census`` (what one forward saves), ``activation_records`` (what
autograd holds per saved tensor, the counters), ``activation_recorder`` (what made each saved
tensor, in the recorded iteration), ``activation_recompute`` (recipes, run again bit-exact) and
``activation_replay`` (recipes bound and verified in later iterations), ``regions`` (tensors
made under a tag, paused and resumed together at the same addresses), ``process_mode``
(the process's mode and the glue's errors), ``shim`` and ``native_abi`` (ctypes faces of the
core's torch shim and torch-native C ABI), ``binding_choice`` and ``binding_build`` (which
binding enable() installs, and building the torch-native one), ``stat_keys`` (the memory_stats
keys and torch's device argument).
Invariants: importing this package never imports torch (only ``activation_recorder`` and
``activation_recompute`` do, and they are imported inside functions); nothing here but re-exports.
"""

from __future__ import annotations

from .activation_census import SavedCensus, saved_census
from .activation_paging import PagedActivations, PagedStats, PagerWarning, paged_activations
from .binding_choice import Binding, BindingFallbackWarning
from .enabling import binding, enable, is_enabled, mempool, mode, resolve_config
from .failure_reports import OomBinding, failures, oom_binding, oom_exception
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    publish_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    stats,
)
from .offloading import offload, prefetch
from .process_mode import AllocatorConflictError, UnsupportedError
from .regions import pause, region, regions, resume

__all__ = [
    "enable", "is_enabled", "mode", "binding", "Binding", "BindingFallbackWarning", "mempool", "resolve_config",
    "stats", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_accumulated_memory_stats", "mem_get_info", "memory_summary", "empty_cache", "failures", "oom_exception",
    "oom_binding", "OomBinding",
    "AllocatorConflictError", "UnsupportedError",
    "paged_activations", "PagedActivations", "PagedStats", "PagerWarning", "saved_census", "SavedCensus", "offload", "prefetch", "publish_stats",
    "region", "pause", "resume", "regions",
]
