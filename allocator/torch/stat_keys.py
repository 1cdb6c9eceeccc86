"""The torch allocator's statistics in PyTorch's vocabulary, and PyTorch's device argument.

Owns: how a ``device`` argument of the PyTorch-named functions is read (:func:`device_index`:
an int, ``"cuda"``, ``"cuda:N"``, a ``torch.device``, or None for the current device, as
``torch.cuda`` reads it; "all" for vtalloc's sum over devices), the flat ``memory_stats`` dict
and its nested form, and the counters ``reset_accumulated_memory_stats`` restarts.

Invariants: never imports torch (a ``torch.device`` is recognized through ``sys.modules``, and
None never initializes CUDA: before CUDA is initialized the current device is 0, the device it
starts on); a bad device is an InvalidArgumentError naming what was given.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any

from . import native_abi as _torch_native, shim as _torch_shim
from ..errors import InvalidArgumentError
from ..stats import Stats

__all__ = ["ALL", "device_index", "device_list", "sum_stats", "flat_stats", "nested", "ACCUMULATED_KEYS"]

ALL = "all"  # vtalloc's own device argument: every device the torch allocator serves, summed
_CUDA_RE = re.compile(r"^cuda(?::([0-9]{1,4}))?$")
_NOT_SUMMED = ("page_bytes", "small_threshold_bytes")
# Keys PyTorch calls accumulated ("allocated"/"freed" counts, num_ooms, device calls) and
# vtalloc's historical counters: what reset_accumulated_memory_stats() restarts from zero.
# PyTorch's are restarted in the C++ shim (vta_torch_reset_accumulated, shared with
# torch.cuda.reset_accumulated_memory_stats() under the torch-native binding); vtalloc's below by
# marks kept here.
ACCUMULATED_KEYS = (
    "vtalloc.num_page_reclaims", "vtalloc.alloc_failures", "vtalloc.capture_refusals", "vtalloc.free_failures",
    "vtalloc.deferred_frees",
)


def _current_device() -> int:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0  # CUDA starts on device 0; asking torch would initialize it
    return int(torch.cuda.current_device())


def device_index(device: Any) -> int:
    """The ordinal ``device`` names, read as torch.cuda reads it; InvalidArgumentError otherwise."""
    if device is None:
        index = _current_device()
    elif isinstance(device, str):
        m = _CUDA_RE.match(device.strip())
        if not m:
            raise InvalidArgumentError(
                f"device must be an ordinal, 'cuda', 'cuda:N' or a torch.device of type cuda, got {device[:40]!r}")
        index = _current_device() if m.group(1) is None else int(m.group(1))
    elif "torch" in sys.modules and isinstance(device, sys.modules["torch"].device):
        if device.type != "cuda":
            raise InvalidArgumentError(f"device must be a CUDA device, got torch.device({str(device)!r})")
        index = _current_device() if device.index is None else device.index
    else:
        index = device  # check_device refuses bools, floats and other types by name
    _torch_shim.check_device(index)
    return index


def device_list(device: Any) -> list[int]:
    """``"all"``: every device with an address space; anything else: the one it names."""
    if isinstance(device, str) and device == ALL:
        return _torch_shim.devices()
    return [device_index(device)]


def sum_stats(per_device: list[Stats]) -> Stats:
    """Stats summed over devices; peaks are the sum of per-device peaks, settings the largest."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        column = [getattr(s, f.name) for s in per_device]
        if column and isinstance(column[0], str):  # a label (evict_mode): one value, or "mixed"
            values[f.name] = column[0] if len(set(column)) == 1 else "mixed"
        else:
            values[f.name] = (max(column) if column else 0) if f.name in _NOT_SUMMED else sum(column)
    if not per_device:
        values["evict_mode"] = "none"
    return Stats(**values)


def _raw(device: int) -> dict[str, int]:
    """One device's memory_stats(): PyTorch's keys from vta_torch_device_stats (the very figures
    torch.cuda.memory_stats() shows under the torch-native binding, accumulated columns already
    counted from the last reset there), vtalloc's own keys from its Stats and failure records."""
    s = _torch_shim.device_stats(device)
    f = _torch_shim.failures(device)
    t = _torch_native.device_stats(device)
    return {
        "allocated_bytes.all.current": t.allocated_bytes[0].current,
        "allocated_bytes.all.peak": t.allocated_bytes[0].peak,
        "requested_bytes.all.current": t.requested_bytes[0].current,
        "requested_bytes.all.peak": t.requested_bytes[0].peak,
        "active_bytes.all.current": t.active_bytes[0].current,
        "reserved_bytes.all.current": t.reserved_bytes[0].current,
        "reserved_bytes.all.peak": t.reserved_bytes[0].peak,
        "allocation.all.current": t.allocation[0].current,
        "allocation.all.allocated": t.allocation[0].allocated,
        "allocation.all.freed": t.allocation[0].freed,
        "num_ooms": t.num_ooms,
        "num_device_alloc": t.num_device_alloc,
        "num_device_free": t.num_device_free,
        "vtalloc.capacity_bytes": s.capacity_bytes,
        "vtalloc.page_bytes": s.page_bytes,
        "vtalloc.mapped_bytes.current": s.mapped_bytes,
        "vtalloc.mapped_bytes.peak": s.peak_mapped_bytes,
        "vtalloc.cached_bytes.current": s.cached_bytes,
        "vtalloc.pending_free_bytes.current": s.pending_free_bytes,
        "vtalloc.reserved_va_bytes.current": s.reserved_va_bytes,
        "vtalloc.pages_total": s.pages_total,
        "vtalloc.pages_mapped": s.pages_mapped,
        "vtalloc.pages_free": s.pages_free,
        "vtalloc.num_page_reclaims": s.num_page_reclaims,
        "vtalloc.alloc_failures": f.alloc_failures,
        "vtalloc.capture_refusals": f.capture_refusals,
        "vtalloc.free_failures": f.free_failures,
        "vtalloc.deferred_frees": f.deferred_frees,
        "vtalloc.devices": 1 if s.capacity_bytes else 0,
    }


def flat_stats(devices: list[int]) -> dict[str, int]:
    """memory_stats() for these devices: summed (page_bytes: the largest), accumulated counters
    counted from each device's last reset_accumulated_memory_stats()."""
    if not devices:  # "all" before any device allocated: every key, zero
        return {key: 0 for key in sorted(_raw(0))}
    total: dict[str, int] = {}
    for d in devices:
        raw, mark = _raw(d), _torch_shim.accumulated_mark(d)
        for key, value in raw.items():
            value -= mark.get(key, 0)
            total[key] = max(total.get(key, 0), value) if key == "vtalloc.page_bytes" else total.get(key, 0) + value
    return dict(sorted(total.items()))


def reset_accumulated(device: int) -> None:
    _torch_native.reset_accumulated(device)
    raw = _raw(device)
    _torch_shim.set_accumulated_mark(device, {key: raw[key] for key in ACCUMULATED_KEYS})


def nested(flat: dict[str, int]) -> dict[str, Any]:
    """The flat "a.b.c" keys as nested dicts, as torch.cuda.memory_stats_as_nested_dict() gives them."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, leaf = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
