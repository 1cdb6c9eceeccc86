"""The allocation-trace file format: record_trace.py writes it, bench_trace.py,
sim_torch_allocator.py and bench_saved_offload.py read it.

Owns: the on-disk form of one allocation trace (a gzip-compressed JSON document), its loading,
validation and the figures every reader needs first (peak live bytes, counts); what a reader's
``--trace`` argument names (``resolve``: a file, a folder of traces, or a stored trace's name).
Invariants: a trace that loads is valid: allocation ids are 0, 1, 2, ... in the order of their
allocations, every size is a positive integer, every free names an earlier allocation that is
still live, no id is freed twice; allocations never freed are live at the end of the trace;
saved marks, when present, are in event order and each names an allocation live at its event.
Nothing here imports vtalloc: a trace is data about PyTorch, not about vtalloc.

The document (``benchmarks/traces/<name>.json.gz``)::

    {
      "format": "vtalloc-trace/1",
      "name": "resnet50",                       # the file's stem
      "source": "cpu-profiler" | "cuda-memory-history",
      "model": {...},                           # what ran: class, config overrides, parameter count
      "workload": {...},                        # batch, input shape, dtype, optimizer, iterations
      "recorded": {...},                        # date, torch/transformers versions, machine, command
      "events": [["a", id, size, stream], ["f", id], ...],
      "saved": [[event_index, id], ...]         # optional: what autograd saved, and when
    }

``["a", id, size, stream]`` is an allocation of ``size`` bytes on ``stream`` (0: the default
stream; other numbers are distinct streams, not driver handles); ``["f", id]`` frees it. The
trace opens with the allocations that exist before the recorded step (parameters and buffers),
so its peak live bytes is the peak a device would hold.

``saved`` (optional; readers that do not need it ignore it): ``[event_index, id]`` says that
after event number ``event_index`` (0-based, into ``events``) autograd saved a tensor for
backward whose storage is allocation ``id``, live then. Marks are ordered by event_index (those
of one event in the order they happened); one allocation may be saved more than once (by
several operations). record_trace.py notes them in the forward passes of the recorded steps,
leaving out parameters, views of them and tensors under 1 KiB, as paged_activations does.
A trace without the field has ``Trace.saved == ()``, and ``to_document`` writes it only when
there are marks.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any, Iterable

FORMAT = "vtalloc-trace/1"
TRACES_DIR = Path(__file__).resolve().parents[1] / "traces"
SOURCES = ("cpu-profiler", "cuda-memory-history")


class TraceError(ValueError):
    """A trace file that is not a valid vtalloc-trace/1 document."""


@dataclasses.dataclass(frozen=True)
class Trace:
    name: str
    source: str
    model: dict[str, Any]
    workload: dict[str, Any]
    recorded: dict[str, Any]
    # ("a", id, size, stream) or ("f", id), in order.
    events: tuple[tuple, ...]
    # (event_index, id): after events[event_index], autograd saved a tensor on allocation id.
    saved: tuple[tuple[int, int], ...] = ()

    @property
    def num_allocs(self) -> int:
        return sum(1 for e in self.events if e[0] == "a")

    @property
    def num_frees(self) -> int:
        return sum(1 for e in self.events if e[0] == "f")

    @property
    def streams(self) -> list[int]:
        return sorted({e[3] for e in self.events if e[0] == "a"})

    def sizes(self) -> dict[int, int]:
        return {e[1]: e[2] for e in self.events if e[0] == "a"}

    def peak_live_bytes(self, round_to: int = 1) -> int:
        """The most bytes live at once, each allocation rounded up to a multiple of ``round_to``."""
        live = peak = 0
        sizes: dict[int, int] = {}
        for e in self.events:
            if e[0] == "a":
                n = -(-e[2] // round_to) * round_to
                sizes[e[1]] = n
                live += n
                peak = max(peak, live)
            else:
                live -= sizes.pop(e[1])
        return peak

    def to_document(self) -> dict[str, Any]:
        doc = {"format": FORMAT, "name": self.name, "source": self.source, "model": self.model,
               "workload": self.workload, "recorded": self.recorded, "events": [list(e) for e in self.events]}
        if self.saved:
            doc["saved"] = [list(m) for m in self.saved]
        return doc


def validate_events(events: Iterable[Any]) -> tuple[tuple, ...]:
    """The events as tuples, or TraceError naming the first bad one."""
    out: list[tuple] = []
    live: set[int] = set()
    next_id = 0
    for i, e in enumerate(events):
        if not isinstance(e, (list, tuple)) or not e or e[0] not in ("a", "f"):
            raise TraceError(f"event {i}: expected ['a', id, size, stream] or ['f', id], got {e!r:.80}")
        if e[0] == "a":
            if len(e) != 4 or not all(type(x) is int for x in e[1:]):
                raise TraceError(f"event {i}: an allocation is ['a', id, size, stream] of integers, got {e!r:.80}")
            _, ident, size, stream = e
            if ident != next_id:
                raise TraceError(f"event {i}: allocation id {ident}, expected {next_id} (ids count allocations)")
            if size <= 0:
                raise TraceError(f"event {i}: allocation {ident} has size {size}; sizes are positive")
            if stream < 0:
                raise TraceError(f"event {i}: allocation {ident} has stream {stream}; streams are >= 0")
            next_id += 1
            live.add(ident)
            out.append(("a", ident, size, stream))
        else:
            if len(e) != 2 or type(e[1]) is not int:
                raise TraceError(f"event {i}: a free is ['f', id], got {e!r:.80}")
            if e[1] not in live:
                raise TraceError(f"event {i}: free of id {e[1]}, which is not live")
            live.remove(e[1])
            out.append(("f", e[1]))
    return tuple(out)


def validate_saved(saved: Iterable[Any], events: tuple[tuple, ...]) -> tuple[tuple[int, int], ...]:
    """The saved marks as (event_index, id) tuples, checked against the (valid) ``events``: in
    event order, each naming an allocation live after its event; or TraceError naming the first bad one."""
    marks: list[tuple[int, int]] = []
    for k, m in enumerate(saved):
        if not isinstance(m, (list, tuple)) or len(m) != 2 or not all(type(x) is int for x in m):
            raise TraceError(f"saved mark {k}: expected [event_index, id] of integers, got {m!r:.80}")
        if not 0 <= m[0] < len(events):
            raise TraceError(f"saved mark {k}: event index {m[0]} is outside the {len(events)} events")
        if marks and m[0] < marks[-1][0]:
            raise TraceError(f"saved mark {k}: event index {m[0]} comes after {marks[-1][0]}; marks are in event order")
        marks.append((m[0], m[1]))
    live: set[int] = set()
    k = 0
    for i, e in enumerate(events):
        if e[0] == "a":
            live.add(e[1])
        else:
            live.discard(e[1])
        while k < len(marks) and marks[k][0] == i:
            if marks[k][1] not in live:
                raise TraceError(f"saved mark {k}: allocation {marks[k][1]} is not live after event {i}")
            k += 1
    return tuple(marks)


def from_document(doc: Any) -> Trace:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"not a {FORMAT} document")
    if doc.get("source") not in SOURCES:
        raise TraceError(f"source must be one of {', '.join(SOURCES)}, got {doc.get('source')!r:.40}")
    for key in ("name",):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise TraceError(f"{key} must be a non-empty string")
    for key in ("model", "workload", "recorded"):
        if not isinstance(doc.get(key), dict):
            raise TraceError(f"{key} must be an object")
    if not isinstance(doc.get("events"), list):
        raise TraceError("events must be a list")
    if not isinstance(doc.get("saved", []), list):
        raise TraceError("saved must be a list")
    events = validate_events(doc["events"])
    return Trace(name=doc["name"], source=doc["source"], model=doc["model"], workload=doc["workload"],
                 recorded=doc["recorded"], events=events, saved=validate_saved(doc.get("saved", []), events))


def load(path: str | Path) -> Trace:
    """Read and validate one trace file (gzip-compressed JSON, or plain JSON if not compressed)."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = json.loads(text)
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: cannot read as gzip JSON: {e}") from None
    try:
        return from_document(doc)
    except TraceError as e:
        raise TraceError(f"{path}: {e}") from None


def save(trace: Trace, path: str | Path) -> Path:
    """Write a trace as compact gzip-compressed JSON (validated first); returns the path."""
    validate_saved(trace.saved, validate_events(trace.events))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(trace.to_document(), separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return path


def stored(directory: Path = TRACES_DIR) -> list[Path]:
    """The trace files stored in the repository (or in ``directory``), by name."""
    return sorted(directory.glob("*.json.gz"))


class TraceNotFound(ValueError):
    """A --trace argument that names no trace file, folder of them or stored trace."""


def resolve(spec: str) -> list[Path]:
    """What a reader's ``--trace`` names: a trace file, a folder of them (every *.json.gz, by name), or
    a bare name of a stored trace (benchmarks/traces/NAME.json.gz)."""
    path = Path(spec)
    if path.is_dir():
        found = stored(path)
        if not found:
            raise TraceNotFound(f"no *.json.gz trace in {spec}")
        return found
    if path.is_file():
        return [path]
    named = TRACES_DIR / f"{spec}.json.gz"
    if "/" not in spec and not spec.endswith(".gz") and named.is_file():
        return [named]
    names = ", ".join(p.name[: -len(".json.gz")] for p in stored()) or "none"
    raise TraceNotFound(f"no trace file, folder of traces or stored trace named {spec!r} (stored: {names})")
