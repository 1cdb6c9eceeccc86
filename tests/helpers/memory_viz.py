"""What PyTorch's memory_viz (torch/utils/viz/MemoryViz.js) reads of a snapshot, checked in Python.

Owns: :func:`check`, which walks a snapshot as MemoryViz.js does (annotate_snapshot, then
process_alloc_data for the "Active Memory Timeline" and simulate_memory for every event of
the "Allocator State History") and raises AssertionError where the page would fail: a missing
or mistyped key, a frame without filename/line/name, a free_requested of a block it does not
know, a block that lies in no segment. The HTML memory_viz page needs a browser and a network
(it loads d3 from a CDN): this is the part of it that decides whether a snapshot opens.
Invariants: reads the snapshot, changes nothing (works on a deep copy).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


@dataclass
class Timeline:
    elements: int          # allocations drawn (one per alloc/free pair, or per unmatched free / live block)
    max_bytes: int         # the timeline's highest point
    events: int            # entries after memory_viz merged each free_requested + free_completed


def _frames(frames: Any, where: str) -> None:
    assert isinstance(frames, list), f"{where}: frames must be a list"
    for f in frames:
        assert isinstance(f.get("filename"), str) and isinstance(f.get("name"), str), f"{where}: frame {f}"
        assert isinstance(f.get("line"), int), f"{where}: frame {f}"


def _annotate(snapshot: dict[str, Any]) -> None:
    """annotate_snapshot: merge free_requested + free_completed of one address into 'free'; blocks get addresses."""
    traces = []
    for device_trace in snapshot["device_traces"]:
        out: list[dict[str, Any]] = []
        for t in device_trace:
            where = f"trace entry {t}"
            assert isinstance(t.get("action"), str), where
            _frames(t.get("frames", []), where)
            if t["action"] in BLOCK_ACTIONS + SEGMENT_ACTIONS:
                assert isinstance(t.get("addr"), int) and isinstance(t.get("size"), int) and t["size"] >= 0, where
            if t["action"] == "oom":
                assert isinstance(t.get("size"), int) and isinstance(t.get("device_free"), int), where
            assert "stream" in t, where
            if t["action"] == "free_completed" and out and out[-1]["action"] == "free_requested" \
                    and out[-1]["addr"] == t["addr"]:
                out[-1]["action"] = "free"
                continue
            out.append(t)
        traces.append(out)
    snapshot["device_traces"] = traces
    for seg in snapshot["segments"]:
        for key in ("device", "address", "total_size", "blocks"):
            assert key in seg, f"segment without {key}: {seg}"
        addr = seg["address"]
        for b in seg["blocks"]:
            assert isinstance(b.get("size"), int) and isinstance(b.get("state"), str), f"block {b}"
            _frames(b.get("frames", []), f"block {b}")
            b["addr"] = addr
            addr += b["size"]


def _timeline(snapshot: dict[str, Any], device: int) -> Timeline:
    """process_alloc_data (plot_segments false): pair each alloc with its free."""
    elements: list[dict[str, Any]] = []
    addr_to_alloc: dict[int, int] = {}
    actions: list[int] = []
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            elements.append(e)
            addr_to_alloc[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif e["action"] in ("free", "free_completed"):
            if e["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(e["addr"]))
            else:
                elements.append(e)
                actions.append(len(elements) - 1)
    initially = [e for seg in snapshot["segments"] if seg["device"] == device for e in seg["blocks"]
                 if e["state"] == "active_allocated" and e["addr"] not in addr_to_alloc]
    total = sum(b["requested_size"] for b in initially)
    current: set[int] = set()
    peak = total
    for elem in actions:
        size = elements[elem]["size"]
        if elem in current:
            current.discard(elem)
            total -= size
        else:
            current.add(elem)
            total += size
        peak = max(peak, total)
    return Timeline(len(elements) + len(initially), peak, len(snapshot["device_traces"][device]))


def _segment_view(snapshot: dict[str, Any], device: int) -> None:
    """simulate_memory at every event: each block placed must lie in a segment."""
    events = snapshot["device_traces"][device]
    segments = sorted((s["address"], s["total_size"]) for s in snapshot["segments"] if s["device"] == device)
    blocks = {b["addr"]: b for s in snapshot["segments"] if s["device"] == device for b in s["blocks"]
              if b["state"] in ("active_allocated", "active_pending_free")}
    for idx in range(-1, len(events)):
        live = dict(blocks)
        segs = list(segments)
        for event in reversed(events[idx + 1:]):
            a = event["action"]
            if a in ("free", "free_completed"):
                live[event["addr"]] = {"addr": event["addr"], "size": event["size"]}
            elif a == "free_requested":
                assert event["addr"] in live, f"free_requested of an unknown block at event {idx}: {event}"
            elif a == "alloc":
                live.pop(event["addr"], None)
            elif a in ("segment_free", "segment_unmap"):
                segs.append((event["addr"], event["size"]))
            elif a in ("segment_alloc", "segment_map"):
                segs = [s for s in segs if s[0] != event["addr"]]
        for b in live.values():
            assert any(s <= b["addr"] < s + n for s, n in segs), \
                f"the segment view fails at event {idx}: block at {b['addr']:#x} lies in no segment"


def check(snapshot: dict[str, Any], device: int = 0) -> Timeline:
    """Raise AssertionError where memory_viz would fail on ``snapshot`` (see the module's docstring)."""
    data = copy.deepcopy(snapshot)
    assert isinstance(data.get("segments"), list) and isinstance(data.get("device_traces"), list)
    assert device < len(data["device_traces"]), "no trace for the device"
    _annotate(data)
    timeline = _timeline(data, device)
    _segment_view(data, device)
    return timeline
