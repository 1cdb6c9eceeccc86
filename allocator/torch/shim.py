"""ctypes face of the PyTorch shim (csrc/include/vtalloc/torch_shim.h). Never imports torch.

Owns: the ctypes mirror of the shim's structs and prototypes (declared on the library that
``_native.load()`` returns, so it is the very copy PyTorch's CUDAPluggableAllocator loads),
the one check of a device ordinal (:func:`check_device`), and small typed wrappers:
configure, per-device stats and failures, trim, release, and how an out-of-memory is bound
to c10::OutOfMemoryError (``oom_binding``, ``exception_selftest``); and the marks
``reset_accumulated_memory_stats`` sets (stat_keys.py reads them), kept here because they
must be forgotten with the spaces, at :func:`release`.
Invariants: the structs below match the header field for field; the options are passed as
the caller gave them and their defaults are the shim's (the one place they are applied):
:func:`configure` is one call (``vta_torch_configure`` normalizes, applies and returns what it
keeps), and :func:`normalized` asks what it would keep, changing nothing; no wrapper ever calls
``vta_torch_alloc`` (it may throw a C++ exception by design, which ctypes cannot carry) except
``alloc_for_test`` which refuses unless the policy is return-NULL.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

from .. import _cabi, _native
from ..config import Config
from ..errors import InvalidArgumentError
from ..stats import Stats

__all__ = [
    "MAX_DEVICES", "ALL_DEVICES", "FAIL_RETURN_NULL", "FAIL_THROW", "Failures", "check_device", "normalized",
    "configure", "current_config", "devices", "device_stats", "reset_peak_stats", "trim", "failures", "release",
    "exception_kind", "OomBinding", "oom_binding", "ExceptionSelftest", "exception_selftest", "alloc_for_test",
    "free_for_test", "set_accumulated_mark", "accumulated_mark",
]

MAX_DEVICES = 64  # VTA_TORCH_MAX_DEVICES: ordinals 0..MAX_DEVICES - 1
ALL_DEVICES = -1  # the device argument of reset_peak_stats / trim that means every device
FAIL_RETURN_NULL, FAIL_THROW = 0, 1
EXC_C10_OOM, EXC_STD_BAD_ALLOC = 1, 2
# VTA_TORCH_OOM_ROUTE_* and VTA_TORCH_OOM_ABI_*, by value; VTA_TORCH_CAUGHT_* bits.
ROUTES = (None, "constructor", "base+vtable")
ABIS = (None, "cxx11", "old")
CAUGHT_AS_C10_OOM, CAUGHT_AS_C10_ERROR = 1, 2
# Room for what the shim copies out (it cuts to fit).
MESSAGE_CAPACITY = 4096
LIBRARIES_CAPACITY = 1024
TYPE_NAME_CAPACITY = 256
WHAT_CAPACITY = 1 << 16

u32, i32, u64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64


class VtaTorchConfig(ctypes.Structure):
    _fields_ = [("struct_size", u32), ("on_failure", u32), ("space", _native.VtaConfig)]


class VtaTorchFailures(ctypes.Structure):
    _fields_ = [("struct_size", u32), ("reserved0", u32)] + [
        (name, u64)
        for name in (
            "alloc_failures", "ooms", "capture_refusals", "free_failures", "deferred_frees",
            "last_oom_requested_bytes", "last_oom_capacity_bytes", "last_oom_mapped_bytes",
        )
    ]


@dataclasses.dataclass(frozen=True)
class OomBinding:
    """How an out-of-memory under enable() reaches Python in this process now, or why not as
    ``torch.OutOfMemoryError`` (docs/torch.md, "An out-of-memory error under enable()")."""

    exception: str               # "torch.OutOfMemoryError", or "RuntimeError" (the fallback)
    route: str | None            # "constructor" or "base+vtable"; None when nothing bound
    abi: str | None              # std::string ABI of torch's c10: "cxx11" (torch 2.7+) or "old"
    libraries: tuple[str, ...]   # the torch libraries the symbols in use came from
    reason: str                  # why nothing bound; "" when a route did


@dataclasses.dataclass(frozen=True)
class ExceptionSelftest:
    """The out-of-memory exception, thrown and caught inside the library."""

    type_name: str               # its dynamic type, mangled: "N3c1016OutOfMemoryErrorE" when bound
    what: str
    caught_as_oom: bool          # a handler for c10::OutOfMemoryError catches it (torch's own typeinfo asked)
    caught_as_error: bool        # a handler for c10::Error catches it


@dataclasses.dataclass(frozen=True)
class Failures:
    """What the shim could not do on one device, and the last message it kept."""

    alloc_failures: int           # requests not served, any reason
    ooms: int                     # of which: out of memory
    capture_refusals: int         # of which: refused during CUDA graph capture
    free_failures: int            # frees that failed (never raised: torch frees in destructors)
    deferred_frees: int           # frees parked while their stream captured a graph
    last_oom_requested_bytes: int
    last_oom_capacity_bytes: int
    last_oom_mapped_bytes: int
    last_message: str


_P = ctypes.POINTER
_PROTOTYPES: _cabi.Prototypes = {
    "vta_torch_set_region": (i32, [u32, _P(u32)]),
    "vta_torch_region_pause": (i32, [i32, u32, u32, _P(u64)]),
    "vta_torch_region_resume": (i32, [i32, u32, u32, _P(u64)]),
    "vta_torch_regions": (i32, [i32, _P(_native.VtaRegionInfo), u64, _P(u64)]),
    "vta_torch_last_error": (ctypes.c_char_p, []),
    "vta_torch_configure": (i32, [_P(VtaTorchConfig), _P(VtaTorchConfig)]),
    "vta_torch_get_config": (i32, [_P(VtaTorchConfig), _P(i32)]),
    "vta_torch_normalize_config": (i32, [_P(VtaTorchConfig), _P(VtaTorchConfig)]),
    "vta_torch_alloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vta_torch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vta_torch_devices": (i32, [_P(u64)]),
    "vta_torch_stats": (i32, [i32, _P(_native.VtaStats)]),
    "vta_torch_reset_peak_stats": (i32, [i32]),
    "vta_torch_trim": (i32, [i32, _P(u64)]),
    "vta_torch_release_offloaded": (i32, [i32, ctypes.c_uint32, _P(u64)]),
    "vta_torch_failures": (i32, [i32, _P(VtaTorchFailures), ctypes.c_char_p, u64]),
    "vta_torch_release": (i32, []),
    "vta_torch_exception_kind": (i32, []),
    "vta_torch_oom_binding": (i32, [_P(i32), _P(i32), ctypes.c_char_p, u64, ctypes.c_char_p, u64]),
    "vta_torch_exception_selftest": (i32, [ctypes.c_char_p, i32, ctypes.c_char_p, u64, ctypes.c_char_p, u64, _P(i32)]),
    "vta_torch_residency_op": (i32, [i32, i32, u64, u64, i32, _P(i32)]),
    "vta_torch_offload_bytes": (i32, [i32, u64, _P(u64)]),
}

# Residency operations on the allocation behind a tensor's storage (vta_torch_residency_op).
OP_SET_EVICTABLE, OP_CLEAR_EVICTABLE, OP_OFFLOAD, OP_PREFETCH, OP_ENSURE_RESIDENT, OP_RESIDENCY = range(6)

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                loaded = _native.load()
                _cabi.declare(loaded, _PROTOTYPES)
                _lib = loaded
    return _lib


def check(status: int) -> None:
    """Raise the vtalloc exception for a non-zero status of a shim function on this thread."""
    _cabi.check(lib(), status)


def check_device(device: int | None, *, every: bool = False) -> None:
    """InvalidArgumentError unless ``device`` is an ordinal the shim serves (or, with ``every``, None)."""
    if every and device is None:
        return
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < MAX_DEVICES:
        what = "None (every device) or an ordinal" if every else "an ordinal"
        raise InvalidArgumentError(f"device must be {what} in 0..{MAX_DEVICES - 1}, got {device!r}")


def _config_struct(config: Config, on_failure: int) -> VtaTorchConfig:
    """The options as the caller gave them (space.device included: the shim ignores it)."""
    c = VtaTorchConfig()
    c.struct_size = ctypes.sizeof(c)
    c.on_failure = on_failure
    c.space = _native.make_config(config)
    return c


def normalized(config: Config, on_failure: int = FAIL_THROW) -> Config:
    """The space options the shim would keep for ``config`` (device 0, backend "auto" -> "cuda"),
    changing nothing; InvalidArgumentError for what configure() would refuse."""
    out = VtaTorchConfig()
    check(lib().vta_torch_normalize_config(ctypes.byref(_config_struct(config, on_failure)), ctypes.byref(out)))
    return _native.config_from_struct(out.space)


def configure(config: Config, on_failure: int) -> Config:
    """Set the options of the per-device spaces (InvalidArgumentError once others are in use);
    returns them as the shim keeps them. One call into the shim: it normalizes, applies and
    writes back what it keeps."""
    kept = VtaTorchConfig()
    check(lib().vta_torch_configure(ctypes.byref(_config_struct(config, on_failure)), ctypes.byref(kept)))
    return _native.config_from_struct(kept.space)


def current_config() -> tuple[bool, int, dict[str, int]]:
    """(configured, on_failure policy, the space options as raw fields)."""
    c = VtaTorchConfig()
    flag = i32()
    check(lib().vta_torch_get_config(ctypes.byref(c), ctypes.byref(flag)))
    space = {name: getattr(c.space, name) for name, *_ in _native.VtaConfig._fields_}
    return bool(flag.value), c.on_failure, space


def devices() -> list[int]:
    """Device ordinals that have an address space."""
    mask = u64()
    check(lib().vta_torch_devices(ctypes.byref(mask)))
    return [d for d in range(MAX_DEVICES) if mask.value >> d & 1]


def device_stats(device: int) -> Stats:
    check_device(device)
    raw = _native.VtaStats()
    check(lib().vta_torch_stats(device, ctypes.byref(raw)))
    return _native.stats_from_struct(raw)


def reset_peak_stats(device: int | None = None) -> None:
    """Peaks restart from the current values: one device, or every device (None)."""
    check_device(device, every=True)
    check(lib().vta_torch_reset_peak_stats(ALL_DEVICES if device is None else device))


def trim(device: int | None = None) -> int:
    """Give cached and unused pages back: one device, or every device (None); bytes released."""
    check_device(device, every=True)
    out = u64()
    check(lib().vta_torch_trim(ALL_DEVICES if device is None else device, ctypes.byref(out)))
    return out.value


def release_offloaded(device: int | None = None, wait: bool = False) -> int:
    """Unmap the device pages offloaded allocations still hold: one device, or every device (None);
    ``wait``: the copies still in flight first."""
    check_device(device, every=True)
    out = u64()
    check(lib().vta_torch_release_offloaded(ALL_DEVICES if device is None else device, 1 if wait else 0,
                                            ctypes.byref(out)))
    return out.value


def failures(device: int) -> Failures:
    check_device(device)
    raw = VtaTorchFailures()
    buf = ctypes.create_string_buffer(MESSAGE_CAPACITY)
    check(lib().vta_torch_failures(device, ctypes.byref(raw), buf, ctypes.sizeof(buf)))
    counts = {name: getattr(raw, name) for name, *_ in VtaTorchFailures._fields_ if name not in ("struct_size", "reserved0")}
    return Failures(**counts, last_message=buf.value.decode("utf-8", "replace"))


def release() -> None:
    """Close every per-device space and forget the options (InvalidArgumentError while any is live)."""
    check(lib().vta_torch_release())
    with _marks_lock:
        _accumulated_marks.clear()  # the spaces' counters restart from zero


# Where reset_accumulated_memory_stats() put each device's zero: counter values subtracted from
# the spaces' own (monotonic) counters; forgotten with the spaces at release().
_accumulated_marks: dict[int, dict[str, int]] = {}
_marks_lock = threading.Lock()


def set_accumulated_mark(device: int, counters: dict[str, int]) -> None:
    check_device(device)
    with _marks_lock:
        _accumulated_marks[device] = dict(counters)


def accumulated_mark(device: int) -> dict[str, int]:
    """The counters at ``device``'s last reset_accumulated_memory_stats() ({} when never reset)."""
    with _marks_lock:
        return dict(_accumulated_marks.get(device, {}))


def exception_kind() -> str:
    """'c10' when an out-of-memory would reach Python as torch.OutOfMemoryError, else 'std'."""
    return "c10" if lib().vta_torch_exception_kind() == EXC_C10_OOM else "std"


def oom_binding() -> OomBinding:
    """How the shim's out-of-memory exception is bound now (it tries to bind first if it has
    not yet). Never imports torch: before torch is imported it says so."""
    route, abi = i32(), i32()
    libraries = ctypes.create_string_buffer(LIBRARIES_CAPACITY)
    reason = ctypes.create_string_buffer(MESSAGE_CAPACITY)
    check(lib().vta_torch_oom_binding(ctypes.byref(route), ctypes.byref(abi), libraries, ctypes.sizeof(libraries),
                                      reason, ctypes.sizeof(reason)))
    bound = ROUTES[route.value]
    return OomBinding(
        exception="torch.OutOfMemoryError" if bound else "RuntimeError",
        route=bound,
        abi=ABIS[abi.value],
        libraries=tuple(name for name in libraries.value.decode().split(", ") if name),
        reason=reason.value.decode("utf-8", "replace"),
    )


def exception_selftest(message: str, route: str | None = None) -> ExceptionSelftest:
    """Throw and catch, inside the library, the exception an out-of-memory would throw (``route``
    None), or the one a given route builds (BackendUnavailableError when it does not bind here)."""
    if route not in ROUTES:
        raise InvalidArgumentError(f"unknown route {route!r}; one of {ROUTES}")
    type_buf = ctypes.create_string_buffer(TYPE_NAME_CAPACITY)
    what_buf = ctypes.create_string_buffer(WHAT_CAPACITY)
    caught = i32()
    check(lib().vta_torch_exception_selftest(message.encode(), ROUTES.index(route), type_buf, ctypes.sizeof(type_buf),
                                             what_buf, ctypes.sizeof(what_buf), ctypes.byref(caught)))
    return ExceptionSelftest(
        type_name=type_buf.value.decode(),
        what=what_buf.value.decode("utf-8", "replace"),
        caught_as_oom=bool(caught.value & CAUGHT_AS_C10_OOM),
        caught_as_error=bool(caught.value & CAUGHT_AS_C10_ERROR),
    )


def alloc_for_test(size: int, device: int = 0, stream: int = 0) -> int:
    """Call vta_torch_alloc from Python: only under the return-NULL policy (a throw would abort)."""
    configured, policy, _ = current_config()
    if not configured or policy != FAIL_RETURN_NULL:
        raise InvalidArgumentError("alloc_for_test needs the shim configured with the return-NULL policy")
    return lib().vta_torch_alloc(size, device, stream or None) or 0


def free_for_test(ptr: int, size: int, device: int = 0, stream: int = 0) -> None:
    lib().vta_torch_free(ptr or None, size, device, stream or None)


def offload_bytes(device: int, address: int) -> int:
    """Offload the allocation at ``address`` on ``device``; the bytes of it now away (pages it
    shares with an allocation not marked evictable stay resident)."""
    check_device(device)
    moved = ctypes.c_uint64()
    check(lib().vta_torch_offload_bytes(device, address, ctypes.byref(moved)))
    return moved.value


def residency_op(device: int, op: int, address: int, stream: int | None = None) -> str | None:
    """Run one eviction-engine call on the shim's space of ``device``; OP_RESIDENCY returns the state."""
    check_device(device)
    out = ctypes.c_int32()
    check(lib().vta_torch_residency_op(device, op, address, 0 if stream is None else stream,
                                       0 if stream is None else 1, ctypes.byref(out)))
    return _native.RESIDENCY_NAMES[out.value] if op == OP_RESIDENCY else None

