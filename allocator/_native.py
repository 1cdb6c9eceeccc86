"""The C++ core's C ABI (``_vtalloc*.so``), through ctypes.

Owns: the ctypes mirror of ``csrc/include/vtalloc/vtalloc.h`` (structs and prototypes),
:func:`load` (the library ``_library`` loaded, these prototypes declared on it) and
:func:`check`, which turns a non-zero status into the matching exception (declared and
read back through ``_cabi``, the edge it shares with ``torch.shim``). Backend names and codes
are the registry's (``backends``), never listed here. ctypes releases the GIL for the duration
of every call, so no core operation holds it.
Invariant: the structs below match the header field for field; ``_library`` refuses a
library whose ABI version differs.
"""

from __future__ import annotations

import ctypes

from . import _cabi, backends
from ._library import library_path, load_with  # noqa: F401  (library_path: re-exported, callers use _native's)
from .config import Config
from .stats import DRIVER_CALL_FIELDS, LATER_DRIVER_CALL_FIELDS



def __getattr__(name: str) -> dict:
    """``BACKEND_CODES`` (name -> code, "auto" included) and ``BACKEND_NAMES`` (code -> name),
    read from the core's registry when asked (allocator/backends.py)."""
    if name == "BACKEND_CODES":
        return {n: backends.code(n) for n in backends.choices()}
    if name == "BACKEND_NAMES":
        return {backends.code(n): n for n in backends.choices()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


u32, i32, u64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64


class VtaConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", u32), ("backend", i32), ("device", i32), ("flags", u32),
        ("capacity_bytes", u64), ("page_bytes", u64), ("small_threshold_bytes", u64),
        ("host_granularity_bytes", u64), ("host_capacity_bytes", u64), ("reservation_bytes", u64),
        ("evict_mode", u32), ("reserved1", u32), ("cost_model", u32), ("reserved2", u32),
        ("extent_bytes", u64),
    ]


class VtaStats(ctypes.Structure):
    _fields_ = [("struct_size", u32), ("reserved0", u32)] + [
        (name, u64)
        for name in (
            "capacity_bytes", "page_bytes", "small_threshold_bytes", "allocated_bytes", "active_bytes",
            "mapped_bytes", "cached_bytes", "peak_allocated_bytes", "peak_active_bytes", "peak_mapped_bytes",
            "reserved_va_bytes", "num_reservations", "pages_total", "pages_mapped", "pages_free",
            "num_live_allocs", "num_allocs", "num_frees", "num_ooms", "num_page_reclaims", "num_map_calls",
            "num_unmap_calls", "pending_free_bytes",
            "evict_mode", "pages_resident", "pages_evicted", "pages_in_flight", "evicted_bytes", "evictable_bytes",
            "evictions", "pressure_evictions", "restores", "bytes_evicted_total", "bytes_restored_total",
            "host_pool_capacity_bytes", "host_pool_bytes", "host_pool_used_bytes", "restore_wait_ns",
            "evict_copy_ns", "restore_copy_ns",
            *DRIVER_CALL_FIELDS, "peak_pages_total",
            # appended: cumulative counters (PyTorch's allocated/freed columns)
            "allocated_bytes_total", "freed_bytes_total", "requested_bytes_total", "requested_freed_bytes_total",
            "page_bytes_created_total", "page_bytes_released_total", "num_alloc_retries", "num_sync_all_streams",
            # appended: extent splits
            "num_extent_splits", "num_extent_splits_staged", "extent_split_pages",
            # appended: a driver call kind after DRIVER_CALL_FIELDS (stats.LATER_DRIVER_CALL_FIELDS)
            *LATER_DRIVER_CALL_FIELDS,
        )
    ]


class VtaPageInfo(ctypes.Structure):
    _fields_ = [("page_id", u64), ("address", u64), ("state", u32), ("num_allocs", u32), ("tag", u64)]


class VtaAllocInfo(ctypes.Structure):
    _fields_ = [("address", u64), ("size_bytes", u64), ("requested_bytes", u64), ("stream", u64)]


REGION_TAG_BYTES = 72  # VTA_REGION_TAG_BYTES


class VtaRegionInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", u32), ("region", u32), ("tag", ctypes.c_char * REGION_TAG_BYTES),
        *((name, u64) for name in (
            "allocations", "bytes", "paused_bytes", "discarded_bytes", "paused_page_bytes", "host_bytes", "pauses",
            "resumes", "bytes_paused_total", "bytes_resumed_total", "pause_ns_total", "resume_ns_total",
        )),
    ]


class VtaPoolInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", u32), ("backend", i32), ("device", i32), ("exportable", u32),
        ("page_bytes", u64), ("capacity_bytes", u64), ("pages_held", u64),
    ]


CONFIG_LEASED = 1
MALLOC_NO_EVICT = 1
MALLOC_TRY = 2  # a shortage is not counted as an OOM (the page source answers it)
RESTORE_WAIT, RESTORE_TRY = 1, 2
EVICT_MODES = {"auto": 0, "copy": 1, "mapped": 2}
EVICT_MODE_NAMES = {v: k for k, v in EVICT_MODES.items()}
COST_MODEL_CODES = {None: 0, "h100": 1, "h200": 2}  # VTA_COST_MODEL_*
COST_MODEL_NAMES = {v: k for k, v in COST_MODEL_CODES.items()}
RESIDENCY_NAMES = {0: "resident", 1: "evicted", 2: "in_flight", 3: "paused"}
PAUSE_DISCARD = 1  # vta_region_pause: keep no copy
NO_PAGE = (1 << 64) - 1
FAULT_OPS = {"copy": 0, "map": 1, "create_page": 2, "set_access": 3}
# vta_debug_break_ordering bits (tests only)
ORDERING_RULES = {"quiesce": 1, "copy_order": 2, "free_wait": 4}
KERNEL_KINDS = {"fill": 0, "check": 1}
MAX_KERNEL_SECONDS = 60.0  # the core refuses longer test kernels (testing/host_kernels.hpp)


class VtaKernelCounters(ctypes.Structure):
    _fields_ = [("struct_size", u32), ("reserved0", u32)] + [
        (name, u64)
        for name in (
            "kernels_launched", "kernels_completed", "kernels_faulted", "copy_faults", "bytes_checked",
            "bytes_mismatched",
        )
    ]


class VtaGlobalCounters(ctypes.Structure):
    _fields_ = [("struct_size", u32), ("reserved0", u32)] + [
        (name, u64)
        for name in (
            "live_spaces", "live_pages", "live_page_bytes", "live_reservations", "reserved_va_bytes",
            "live_mappings", "pinned_host_bytes", "live_events", "live_streams",
        )
    ]


_P = ctypes.POINTER
_PROTOTYPES: _cabi.Prototypes = {
    "vta_abi_version": (i32, []),
    "vta_last_error": (ctypes.c_char_p, []),
    "vta_last_oom": (None, [_P(u64), _P(u64), _P(u64)]),
    "vta_global_counters": (i32, [_P(VtaGlobalCounters)]),
    "vta_backend_probe": (i32, [i32, i32]),
    "vta_backend_conformance": (i32, [i32, i32, ctypes.c_char_p, u64, _P(i32)]),
    "vta_test_register_toy_backend": (i32, [ctypes.c_char_p, _P(i32)]),
    "vta_space_create": (i32, [_P(VtaConfig), _P(ctypes.c_void_p)]),
    "vta_space_close": (i32, [ctypes.c_void_p]),
    "vta_space_destroy": (None, [ctypes.c_void_p]),
    "vta_space_backend": (i32, [ctypes.c_void_p, _P(i32), _P(i32)]),
    "vta_space_modeled_ns": (i32, [ctypes.c_void_p, _P(i32), _P(u64)]),
    "vta_malloc": (i32, [ctypes.c_void_p, u64, u64, _P(u64)]),
    "vta_malloc_ex": (i32, [ctypes.c_void_p, u64, u64, u32, _P(u64)]),
    "vta_free": (i32, [ctypes.c_void_p, u64]),
    "vta_size_of": (i32, [ctypes.c_void_p, u64, _P(u64)]),
    "vta_record_stream": (i32, [ctypes.c_void_p, u64, u64]),
    "vta_write": (i32, [ctypes.c_void_p, u64, u64, ctypes.c_void_p, u64]),
    "vta_read": (i32, [ctypes.c_void_p, u64, u64, ctypes.c_void_p, u64]),
    "vta_trim": (i32, [ctypes.c_void_p, _P(u64)]),
    "vta_release_offloaded": (i32, [ctypes.c_void_p, ctypes.c_uint32, _P(u64)]),
    "vta_synchronize": (i32, [ctypes.c_void_p]),
    "vta_stats": (i32, [ctypes.c_void_p, _P(VtaStats)]),
    "vta_reset_peak_stats": (i32, [ctypes.c_void_p]),
    "vta_pages": (i32, [ctypes.c_void_p, _P(VtaPageInfo), u64, _P(u64)]),
    "vta_allocations": (i32, [ctypes.c_void_p, _P(VtaAllocInfo), u64, _P(u64)]),
    "vta_set_evictable": (i32, [ctypes.c_void_p, u64, i32]),
    "vta_offload": (i32, [ctypes.c_void_p, u64]),
    "vta_offload_bytes": (i32, [ctypes.c_void_p, u64, _P(u64)]),
    "vta_restore": (i32, [ctypes.c_void_p, u64, u64, i32, u32]),
    # vta_restore's aliases (vtalloc.h), typed for old callers; nothing here calls them.
    "vta_prefetch": (i32, [ctypes.c_void_p, u64, u64, i32]),
    "vta_ensure_resident": (i32, [ctypes.c_void_p, u64, u64, i32]),
    "vta_residency": (i32, [ctypes.c_void_p, u64, _P(i32)]),
    "vta_debug_inject_fault": (i32, [ctypes.c_void_p, i32, i32]),
    "vta_debug_inject_fault_after": (i32, [ctypes.c_void_p, i32, i32, i32]),
    "vta_debug_break_ordering": (i32, [ctypes.c_void_p, ctypes.c_uint32]),
    "vta_debug_stream_create": (i32, [ctypes.c_void_p, _P(u64)]),
    "vta_debug_stream_destroy": (i32, [ctypes.c_void_p, u64]),
    "vta_debug_stream_synchronize": (i32, [ctypes.c_void_p, u64]),
    "vta_debug_run_kernel": (i32, [ctypes.c_void_p, u64, u64, u64, i32, u64, u64]),
    "vta_debug_kernel_counters": (i32, [ctypes.c_void_p, _P(VtaKernelCounters)]),
    "vta_debug_fault_totals": (i32, [_P(u64), _P(u64)]),
    "vta_debug_victim_counters": (i32, [ctypes.c_void_p, _P(u64), _P(u64)]),
    "vta_space_import_page": (i32, [ctypes.c_void_p, i32, u64]),
    "vta_space_return_pages": (i32, [ctypes.c_void_p, u64, _P(u64), _P(u64)]),
    "vta_region_tag": (i32, [ctypes.c_char_p, _P(u32)]),
    "vta_region_tag_name": (i32, [u32, ctypes.c_char_p, u64]),
    "vta_malloc_region": (i32, [ctypes.c_void_p, u64, u64, u32, u32, _P(u64)]),
    "vta_region_pause": (i32, [ctypes.c_void_p, u32, u32, _P(u64)]),
    "vta_region_resume": (i32, [ctypes.c_void_p, u32, u32, _P(u64)]),
    "vta_regions": (i32, [ctypes.c_void_p, _P(VtaRegionInfo), u64, _P(u64)]),
    "vta_pool_create": (i32, [_P(VtaConfig), _P(ctypes.c_void_p)]),
    "vta_pool_close": (i32, [ctypes.c_void_p]),
    "vta_pool_destroy": (None, [ctypes.c_void_p]),
    "vta_pool_info": (i32, [ctypes.c_void_p, _P(VtaPoolInfo)]),
    "vta_pool_create_page": (i32, [ctypes.c_void_p, _P(u64)]),
    "vta_pool_export_page": (i32, [ctypes.c_void_p, u64, _P(i32)]),
    "vta_pool_release_page": (i32, [ctypes.c_void_p, u64]),
}


def make_config(config: Config, *, flags: int = 0) -> VtaConfig:
    """The C mirror of a :class:`vtalloc.allocator.config.Config`."""
    c = VtaConfig()
    c.struct_size = ctypes.sizeof(c)
    c.backend = backends.code(config.backend)
    c.device = config.device
    c.flags = flags
    c.capacity_bytes = config.capacity or 0
    c.page_bytes = config.page_size or 0
    c.small_threshold_bytes = config.small_threshold or 0
    c.host_granularity_bytes = config.host_granularity or 0
    c.host_capacity_bytes = config.host_capacity or 0
    c.reservation_bytes = config.reservation_size or 0
    c.evict_mode = EVICT_MODES[config.evict_mode]
    c.cost_model = COST_MODEL_CODES[config.cost_model]
    c.extent_bytes = config.extent_size or 0
    return c


def config_from_struct(raw: VtaConfig) -> Config:
    """The :class:`~vtalloc.allocator.config.Config` a vta_config_t mirrors (the inverse of
    :func:`make_config`; 0 means "the default")."""
    return Config(
        backend=backends.name_of(raw.backend),
        device=raw.device,
        capacity=raw.capacity_bytes or None,
        page_size=raw.page_bytes or None,
        small_threshold=raw.small_threshold_bytes or None,
        host_granularity=raw.host_granularity_bytes or None,
        host_capacity=raw.host_capacity_bytes or None,
        reservation_size=raw.reservation_bytes or None,
        evict_mode=EVICT_MODE_NAMES[raw.evict_mode],
        cost_model=COST_MODEL_NAMES[raw.cost_model],
        extent_size=raw.extent_bytes or None,
    )

def load() -> ctypes.CDLL:
    """The library (``_library``), every prototype of vtalloc.h declared on it."""
    return load_with(_PROTOTYPES)


def check(status: int) -> None:
    """Raise the exception for a non-zero status returned on this thread."""
    _cabi.check(load(), status)


def stats_from_struct(raw: VtaStats):
    """The typed :class:`~vtalloc.allocator.stats.Stats` of a native vta_stats_t."""
    from .stats import Stats

    values = {f: getattr(raw, f) for f in Stats.__dataclass_fields__}
    values["evict_mode"] = EVICT_MODE_NAMES[raw.evict_mode]
    return Stats(**values)


def backend_conformance(backend: str, device: int = 0) -> tuple[int, str]:
    """Run the driver-seam contract checks on a fresh backend: (failed checks, report)."""
    lib = load()
    buf = ctypes.create_string_buffer(1 << 16)
    failures = i32()
    check(lib.vta_backend_conformance(backends.code(backend), device, buf, len(buf), ctypes.byref(failures)))
    return failures.value, buf.value.decode()


def global_counters() -> dict[str, int]:
    """What every backend in this process holds right now (all zero once every space closed)."""
    lib = load()
    out = VtaGlobalCounters()
    check(lib.vta_global_counters(ctypes.byref(out)))
    return {name: getattr(out, name) for name, *_ in VtaGlobalCounters._fields_ if name not in ("struct_size", "reserved0")}


def guarded_fault_totals() -> tuple[int, int]:
    """(kernel faults, copy faults) the host backend's fault guards caught in this process, ever."""
    lib = load()
    kernels, copies = u64(), u64()
    check(lib.vta_debug_fault_totals(ctypes.byref(kernels), ctypes.byref(copies)))
    return kernels.value, copies.value
