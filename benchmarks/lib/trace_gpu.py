"""trace_gpu: bench_trace.py's GPU mode (``--torch``): a trace replayed through ``torch.empty`` /
``del`` under the native caching allocator, ``expandable_segments`` or vtalloc, each try in its
own process, and the smallest capacity with no OOM searched across such processes.

Owns: ``Device`` (what the replay needs of a device; tests pass a fake one), ``replay_on_device``
(the device-agnostic body), ``TorchDevice``, ``cuda_unavailable_reason``, ``torch_child`` (one
replay in a fresh process: ``bench_trace.py --torch-child``), ``run_torch_child`` (that process,
started and read back), and ``torch_uncapped`` / ``torch_search`` / ``torch_measure``.
Invariants: every try runs in its own process (a clean CUDA context and allocator), capped at its
capacity; a replay stops at its first OOM and its peaks are read before the clean-up frees what
is still live; errors other than OOM propagate; a child that did not finish is a result with its
status, never a guessed figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from lib import trace_format
from lib.capacity_search import BenchError, search_min

SCRIPT = Path(__file__).resolve().parents[1] / "bench_trace.py"  # whose --torch-child runs torch_child()


class Device(Protocol):
    """What the GPU replay needs of a device; tests pass a fake one."""

    def stream(self, number: int) -> Any: ...          # the stream for trace stream ``number`` (0: default)
    def alloc(self, size: int, stream: Any) -> Any: ...  # a handle; raises on OOM
    def free(self, handle: Any) -> None: ...           # called once per handle, in trace order
    def is_oom(self, error: BaseException) -> bool: ...
    def synchronize(self) -> None: ...
    def peaks(self) -> dict[str, Any]: ...             # peak_reserved_bytes, peak_allocated_bytes, ...


def replay_on_device(events: Sequence[tuple], device: Device) -> dict[str, Any]:
    """Replay a trace's events on ``device``, stopping at the first OOM; peaks are read after the
    replay (before the clean-up frees what is still live). Errors other than OOM propagate."""
    streams = {n: device.stream(n) for n in sorted({e[3] for e in events if e[0] == "a"})}
    live: dict[int, Any] = {}
    oom: dict[str, Any] | None = None
    done = 0
    t0 = time.perf_counter_ns()
    for k, e in enumerate(events):
        if e[0] == "a":
            try:
                live[e[1]] = device.alloc(e[2], streams[e[3]])
            except Exception as exc:  # noqa: BLE001 - the device says which errors are OOMs
                if not device.is_oom(exc):
                    raise
                oom = {"event": k, "size": e[2], "error": (str(exc).splitlines() or [""])[0][:300]}
                break
        else:
            device.free(live.pop(e[1]))
        done += 1
    device.synchronize()
    wall = time.perf_counter_ns() - t0
    peaks = device.peaks()
    for ident in list(live):
        device.free(live.pop(ident))
    device.synchronize()
    return {"ok": oom is None, "events_done": done, "oom": oom, "wall_s": wall / 1e9, **peaks}


class TorchDevice:
    """torch.empty(size, uint8, cuda) under torch.cuda.stream(s); a handle is the tensor, and
    dropping the last reference (the replay's) is the free."""

    def __init__(self, torch: Any, vt: Any = None) -> None:
        self.torch, self.vt = torch, vt

    def stream(self, number: int) -> Any:
        return self.torch.cuda.current_stream() if number == 0 else self.torch.cuda.Stream()

    def alloc(self, size: int, stream: Any) -> Any:
        torch = self.torch
        with torch.cuda.stream(stream):
            return torch.empty(size, dtype=torch.uint8, device="cuda")

    def free(self, handle: Any) -> None:
        del handle  # the caller held the other reference and dropped it: the tensor dies here

    def is_oom(self, error: BaseException) -> bool:
        oom = getattr(self.torch, "OutOfMemoryError", None) or self.torch.cuda.OutOfMemoryError
        return isinstance(error, oom)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def peaks(self) -> dict[str, Any]:
        cuda = self.torch.cuda
        torch_api: dict[str, Any] = {}
        try:
            torch_api = {"peak_reserved_bytes": cuda.max_memory_reserved(), "peak_allocated_bytes":
                         cuda.max_memory_allocated(),
                         "peak_requested_bytes": cuda.memory_stats().get("requested_bytes.all.peak")}
        except Exception as e:  # noqa: BLE001 - a pluggable allocator may not answer
            torch_api = {"error": str(e)[:200]}
        if self.vt is None:
            return {**torch_api, "stats_from": "torch.cuda"}
        s = self.vt.memory_stats()
        return {"peak_reserved_bytes": s["reserved_bytes.all.peak"],
                "peak_allocated_bytes": s["allocated_bytes.all.peak"],
                "peak_requested_bytes": s["requested_bytes.all.peak"], "stats_from": "vtalloc.allocator.torch",
                "torch_api": torch_api, "binding": self.vt.binding().kind}


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot use a CUDA device here, or None when it can."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable: {e}"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable CUDA device"
    return None


def torch_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One replay in this (fresh) process under one allocator, capped at cfg["capacity"] bytes (None: uncapped)."""
    reason = cuda_unavailable_reason()
    if reason:
        return {"status": "no_cuda", "why": reason}
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    cap, vt = cfg.get("capacity"), None
    if cfg["allocator"] == "vtalloc":
        import vtalloc.allocator.torch as vt

        vt.enable(**cfg.get("options", {}), **({"capacity": cap} if cap is not None else {}))
    elif cap is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    trace = trace_format.load(cfg["trace"])
    result = replay_on_device(trace.events, TorchDevice(torch, vt))
    return {"status": "ok", "allocator": cfg["allocator"], "capacity_bytes": cap, "total_memory_bytes": total,
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, **result}


def run_torch_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if cfg["allocator"] == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        p = subprocess.run([sys.executable, str(SCRIPT), "--torch-child", json.dumps(cfg)], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": timeout}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return {"status": "error", "returncode": p.returncode, "error": "\n".join(lines[-8:])}


Runner = Callable[[dict[str, Any], float], dict[str, Any]]


def torch_uncapped(path: Path, allocator: str, options: dict[str, Any], *, timeout: float,
                   run: Runner | None = None) -> dict[str, Any]:
    """One uncapped replay under ``allocator``: its peaks (reserved, allocated, requested)."""
    cfg = {"trace": str(path), "allocator": allocator, "options": options, "capacity": None}
    return (run or run_torch_child)(cfg, timeout)


def torch_search(path: Path, allocator: str, peak_live: int, unit: int, options: dict[str, Any],
                 uncapped: dict[str, Any], *, deadline: float | None, timeout: float,
                 run: Runner | None = None) -> dict[str, Any]:
    """The smallest capacity (a multiple of ``unit``) with no OOM, each try in its own process: from
    peak live up, the uncapped peak reserved as the first guess, the device's memory as the limit."""
    base = {"trace": str(path), "allocator": allocator, "options": options}
    failures: list[dict[str, Any]] = []

    def fits(u: int) -> bool:
        r = (run or run_torch_child)({**base, "capacity": u * unit}, timeout)
        if r.get("status") != "ok":
            failures.append(r)
            raise BenchError(f"{allocator} at {u * unit} B: {r.get('status')}: {str(r.get('error', ''))[:300]}")
        return bool(r["ok"])

    guess = -(-uncapped["peak_reserved_bytes"] // unit)
    try:
        found = search_min(fits, -(-peak_live // unit), limit=uncapped["total_memory_bytes"] // unit, guess=guess,
                           deadline=deadline)
    except BenchError as e:
        return {"error": str(e), "child": failures[-1] if failures else None}
    return {"bytes": None if found.units is None else found.units * unit, "exact": found.exact,
            "largest_failing_bytes": None if found.largest_failing is None else found.largest_failing * unit,
            "overhead_pct": None if found.units is None else (found.units * unit - peak_live) / peak_live * 100,
            "resolution_bytes": unit, "tries": [{"capacity_bytes": u * unit, "ok": ok} for u, ok in found.tries]}


def torch_measure(path: Path, allocator: str, peak_live: int, unit: int, options: dict[str, Any], *,
                  deadline: float | None, timeout: float, run: Runner | None = None) -> dict[str, Any]:
    """Uncapped peaks, then the capacity search (when the uncapped replay finished)."""
    row: dict[str, Any] = {"allocator": allocator,
                           "uncapped": torch_uncapped(path, allocator, options, timeout=timeout, run=run)}
    if row["uncapped"].get("status") == "ok" and row["uncapped"].get("ok"):
        row["min_capacity"] = torch_search(path, allocator, peak_live, unit, options, row["uncapped"],
                                           deadline=deadline, timeout=timeout, run=run)
    return row
