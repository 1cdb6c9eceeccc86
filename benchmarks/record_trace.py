"""record_trace: record the allocation trace of real models' training steps (benchmarks/traces/).

Owns: building the models a trace is recorded from (transformers configs with random weights; their
table, MODELS, is lib/trace_models.py's), their batches and losses; the training step (forward, loss,
backward, AdamW step, zero_grad(set_to_none=True)), the two ways of watching an allocator (the CPU
profiler's memory events; on CUDA, the caching allocator's memory history), their conversion into
vtalloc-trace/1 events (lib/trace_format.py), and the CLI.
Invariants: nothing is downloaded (configs only, HF_HUB_OFFLINE=1); transformers is imported only
inside the model builders, so everything else here, record_steps_cpu() and snapshot_to_events()
included, works with torch alone; a trace holds one warm-up step's aftermath, never the warm-up
itself; every free is paired with the allocation at its address, and a free of an address not
allocated during the recording becomes an allocation that opens the trace (it existed before).

What the CPU path sees. ``torch.profiler.profile(profile_memory=True)`` reports each block the
host allocator (c10's DefaultCPUAllocator) hands out or takes back, with its address and requested
size; sizes are exact (no rounding). The allocator's reporter knows a block's size only if the
block was allocated while some memory profiler was on, and reports no free for any other block. So
the warm-up step runs under a throwaway memory profiler too (its events are dropped): every block
the warm-up leaves behind is then known, and its free, if a recorded step frees it, is reported.
Parameters, buffers, gradients and optimizer state are enumerated from Python when the recording
starts and open the trace. Each event carries the reporter's running total of live bytes, so the
recorder counts the events whose total does not follow from the one before (a wrong order or a
lost event; stored as running_total_mismatches). Memory a kernel gets other than through c10's
allocator is invisible. What differs from a CUDA step: CPU kernels' workspaces and temporaries;
host-only tensors are in the trace (AdamW's 4-byte step counters, and the 0-dim tensors CPU ops
wrap Python scalars in, 4 or 8 bytes, where CUDA's foreach kernels take scalars by value); the
optimizer is AdamW(foreach=True), CUDA's default, on CPU its per-tensor fallback, with the same
outputs allocated.

Saved marks (the trace's ``saved``): the recorded steps' forward passes run under a pack hook
(note_saved) that returns the tensor unchanged and marks each one paged_activations would page
with an empty profiler range ``vtalloc::saved::<storage address>``; ordered with the memory
events by start time, a mark names the allocation then live at its address (none: counted as
``saved_unmatched``). Allocator events inside a marker would be its own: dropped and counted.

    python benchmarks/record_trace.py --model resnet50 --model bert
    python benchmarks/record_trace.py --model all --out /tmp/traces
    python benchmarks/record_trace.py --model extra --out /tmp/traces
    python benchmarks/record_trace.py --model resnet50 --batch 32 --name resnet50_b32 --out /tmp/traces
    python benchmarks/record_trace.py --model llama --device cuda --batch 8 --seq-len 1024
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from lib import trace_format
from lib.provenance import git_info, machine_info
from lib.trace_models import EXTRA, MODELS, STORED, ModelSpec

MiB = 1 << 20
Batch = dict[str, torch.Tensor]
MakeBatch = Callable[[int], Batch]  # step number -> the step's inputs, made on the model's device
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
LR = 1e-4
DEFAULT_STEPS = 2
DEFAULT_MAX_ENTRIES = 1_000_000


# -- events: allocations and frees by address, paired into trace events ------------------------

@dataclasses.dataclass
class Pairing:
    """Allocations and frees seen by address, turned into trace events with ids in allocation order.

    Keys: an allocation made during the recording gets key n >= 0 (its rank among those); one that
    existed before gets key -(k + 1) (its rank among those) and its trace id is k, so they open the
    trace whatever the moment they are discovered.
    """

    initial: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (size, stream)
    body: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)  # ("a", key, size, stream) | ("f", key)
    live: dict[int, int] = dataclasses.field(default_factory=dict)  # address -> key
    allocated: int = 0
    unknown_frees: int = 0  # frees of an address not allocated during the recording
    missed_frees: int = 0  # allocations at an address still live: the watcher missed its free
    marks: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (len(body) then, key)
    unmatched_saved: int = 0  # saved marks at an address with no live allocation

    def existing(self, addr: int, size: int, stream: int = 0) -> None:
        """A block live when the recording starts (or, at the end, live since before it)."""
        self.initial.append((size, stream))
        self.live[addr] = -len(self.initial)

    def alloc(self, addr: int, size: int, stream: int = 0) -> None:
        if addr in self.live:
            self.missed_frees += 1
            self.body.append(("f", self.live.pop(addr)))
        self.live[addr] = self.allocated
        self.body.append(("a", self.allocated, size, stream))
        self.allocated += 1

    def free(self, addr: int, size: int, stream: int = 0) -> None:
        if addr not in self.live:
            self.unknown_frees += 1
            self.existing(addr, size, stream)
        self.body.append(("f", self.live.pop(addr)))

    def saved(self, addr: int) -> None:
        """Autograd saved a tensor whose storage starts at ``addr``, after the events so far."""
        if addr in self.live:
            self.marks.append((len(self.body), self.live[addr]))
        else:
            self.unmatched_saved += 1

    def _ident(self, key: int) -> int:
        return -key - 1 if key < 0 else len(self.initial) + key

    def events(self) -> list[tuple[Any, ...]]:
        ident = self._ident
        out: list[tuple[Any, ...]] = [("a", i, size, stream) for i, (size, stream) in enumerate(self.initial)]
        for e in self.body:
            out.append(("a", ident(e[1]), e[2], e[3]) if e[0] == "a" else ("f", ident(e[1])))
        return out

    def saved_marks(self) -> list[tuple[int, int]]:
        """The marks as trace_format's (event_index, id): after the last event seen before each."""
        return [(len(self.initial) + n - 1, self._ident(key)) for n, key in self.marks]

    def stats(self) -> dict[str, int]:
        return {"initial_allocations": len(self.initial), "unknown_frees": self.unknown_frees,
                "missed_frees": self.missed_frees}


def snapshot_to_events(snapshot: dict[str, Any], device: int = 0) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """Trace events from a ``torch.cuda.memory._snapshot()`` taken after the recorded steps.

    ``device_traces[device]`` entries in order: ``alloc`` allocates ``size`` bytes at ``addr``,
    ``free_completed`` frees it (the block is reusable from then on; ``free_requested`` is when the
    tensor died, possibly earlier under record_stream); other actions (segment_alloc, segment_free,
    free_requested, oom, snapshot) are ignored. Stream handles become 0 (the default stream, handle
    0) and 1, 2, ... in order of first use. The allocations that existed before the recording are
    the freed addresses never allocated in it, and the blocks of the snapshot's segments still
    allocated at the end at an address the trace does not hold live. Returns (events, stats).
    """
    streams: dict[int, int] = {0: 0}

    def stream_of(handle: int) -> int:
        return streams.setdefault(handle, len(streams))

    pairing = Pairing()
    ignored = 0
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            pairing.alloc(e["addr"], e["size"], stream_of(e["stream"]))
        elif e["action"] == "free_completed":
            pairing.free(e["addr"], e["size"], stream_of(e["stream"]))
        else:
            ignored += 1
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        for block in seg["blocks"]:
            if block["state"] in ("active_allocated", "active_awaiting_free") and block["address"] not in pairing.live:
                size = block.get("requested_size") or block["size"]
                pairing.existing(block["address"], size, stream_of(seg["stream"]))
    return pairing.events(), {**pairing.stats(), "ignored_entries": ignored,
                              "streams": {str(h): s for h, s in streams.items()}}


# -- the training step and the two recorders -------------------------------------------------

def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)


OPTIMIZER = {"class": "torch.optim.AdamW", "lr": LR, "foreach": True,
             "zero_grad": "set_to_none=True"}


SAVED_MARKER = "vtalloc::saved::"  # + the saved tensor's storage address: a profiler range's name
SAVED_MIN_BYTES = 1024  # paged_activations' DEFAULT_MIN_BYTES: smaller saved tensors are not paged


def note_saved(tensor: torch.Tensor) -> torch.Tensor:
    """A pack hook: marks a tensor paged_activations would page (its rule: not a parameter or a
    view of one, at least SAVED_MIN_BYTES) with an empty profiler range; returns it unchanged."""
    base = tensor._base if tensor._base is not None else tensor
    if not (base.is_leaf and base.requires_grad) and tensor.numel() * tensor.element_size() >= SAVED_MIN_BYTES:
        with torch.profiler.record_function(SAVED_MARKER + str(tensor.untyped_storage().data_ptr())):
            pass
    return tensor


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, loss_fn: LossFn,
               mark_saved: bool = False) -> None:
    """One step; ``mark_saved``: the forward pass (model and loss) under the note_saved pack hook."""
    hooks = torch.autograd.graph.saved_tensors_hooks(note_saved, lambda t: t)
    with hooks if mark_saved else contextlib.nullcontext():
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _live_storages(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[int, int]:
    """Address -> bytes of every storage the model and optimizer hold (parameters, gradients,
    buffers, optimizer state), once per storage."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for state in opt.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    out: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.nbytes() > 0:
            out[s.data_ptr()] = s.nbytes()
    return out


def _cpu_memory_events(prof: torch.profiler.profile) -> tuple[list[tuple[int, int | None]], dict[str, int]]:
    """(address, signed bytes) of every host-allocator event the profiler recorded, and (address,
    None) for each saved mark (note_saved's ranges), in time order; and checks: events of other
    devices dropped, allocator events inside a marker's range dropped, and events whose allocator
    running total (``total_allocated``, kept under the allocator's lock) does not follow from the
    one before, which would mean the order is wrong or an event is missing."""
    from torch._C._profiler import _EventType
    from torch.profiler import _utils

    tree = prof.profiler.kineto_results.experimental_event_tree()
    found: list[tuple[int, int, Any]] = []
    in_marker = 0
    for i, e in enumerate(_utils.traverse_dfs(tree)):
        if e.typed[0] == _EventType.TorchOp and e.name.startswith(SAVED_MARKER):
            found.append((e.start_time_ns, i, int(e.name[len(SAVED_MARKER):])))
        elif e.typed[0] == _EventType.Allocation:
            p = e.parent
            while p is not None and not p.name.startswith(SAVED_MARKER):
                p = p.parent
            in_marker += p is not None
            if p is None:
                found.append((e.start_time_ns, i, e.typed[1]))
    found.sort(key=lambda x: (x[0], x[1]))
    memory = [f for _, _, f in found if not isinstance(f, int)]
    cpu = [f for f in memory if f.device.type == "cpu"]
    out_of_step = sum(1 for a, b in zip(cpu, cpu[1:]) if b.total_allocated != a.total_allocated + b.alloc_size)
    out: list[tuple[int, int | None]] = [(f, None) if isinstance(f, int) else (f.ptr, f.alloc_size) for _, _, f in found
                                         if isinstance(f, int) or f.device.type == "cpu"]
    return out, {"other_device_events_dropped": len(memory) - len(cpu), "marker_allocations_dropped": in_marker,
                 "running_total_mismatches": out_of_step}


def record_steps_cpu(model: torch.nn.Module, make_batch: MakeBatch, loss_fn: LossFn,
                     steps: int = DEFAULT_STEPS) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """One warm-up step, then ``steps`` recorded training steps of ``model`` (on CPU) under the
    memory profiler, their forward passes marking what autograd saves. Returns the trace events
    and the recording's stats, whose ``saved`` is trace_format's list of (event_index, id) marks."""
    from torch.profiler import ProfilerActivity, profile

    opt = make_optimizer(model)
    model.train()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):  # only so sizes are known
        train_step(model, opt, make_batch(0), loss_fn)
    warm = time.perf_counter() - t0
    gc.collect()
    pairing = Pairing()
    for addr, size in _live_storages(model, opt).items():
        pairing.existing(addr, size)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for step in range(1, steps + 1):
            train_step(model, opt, make_batch(step), loss_fn, mark_saved=True)
    steps_s = time.perf_counter() - t0
    events, checks = _cpu_memory_events(prof)
    for addr, size in events:
        if size is None:
            pairing.saved(addr)
        elif size > 0:
            pairing.alloc(addr, size)
        else:
            pairing.free(addr, -size)
    return pairing.events(), {**pairing.stats(), **checks, "saved_marks": len(pairing.marks),
                              "saved_unmatched": pairing.unmatched_saved,
                              "warmup_seconds": round(warm, 2), "recorded_steps_seconds": round(steps_s, 2),
                              "saved": pairing.saved_marks()}


def record_steps_cuda(model: torch.nn.Module, make_batch: MakeBatch, loss_fn: LossFn, steps: int = DEFAULT_STEPS,
                      max_entries: int = DEFAULT_MAX_ENTRIES) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """The same on CUDA, watched through the caching allocator's memory history."""
    opt = make_optimizer(model)
    model.train()
    t0 = time.perf_counter()
    train_step(model, opt, make_batch(0), loss_fn)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    gc.collect()
    device = torch.cuda.current_device()
    t0 = time.perf_counter()
    torch.cuda.memory._record_memory_history("all", context=None, max_entries=max_entries, clear_history=True)
    try:
        for step in range(1, steps + 1):
            train_step(model, opt, make_batch(step), loss_fn)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(None)
    steps_s = time.perf_counter() - t0
    if len(snapshot["device_traces"][device]) >= max_entries:
        raise RuntimeError(f"the memory history filled its {max_entries} entries and lost the oldest: "
                           "raise --max-entries or lower --steps")
    events, stats = snapshot_to_events(snapshot, device)
    return events, {**stats, "warmup_seconds": round(warm, 2), "recorded_steps_seconds": round(steps_s, 2)}


# -- the models ------------------------------------------------------------------------------

class MissingDependency(RuntimeError):
    """transformers is not installed (only the model builders need it)."""


@dataclasses.dataclass
class Workload:
    model: torch.nn.Module
    make_batch: MakeBatch
    loss_fn: LossFn
    model_info: dict[str, Any]
    workload_info: dict[str, Any]


def _transformers() -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"  # models are built from configs: nothing may be fetched
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError:
        raise MissingDependency("the models come from transformers: pip install transformers") from None
    return transformers


def _hf_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


def build(spec: ModelSpec, batch: int, size: int, device: str) -> Workload:
    """The model (random weights, fp32, on ``device``), its batches and its loss."""
    tf = _transformers()
    torch.manual_seed(0)
    overrides = spec.overrides
    if spec.vision and overrides.get("image_size", size) != size:  # ViT, DeiT, Swin: sized for their images
        overrides = {**overrides, "image_size": size}
    if spec.task == "speech-seq2seq":  # the encoder takes exactly 2 * max_source_positions frames
        size += size % 2
        overrides = {**overrides, "max_source_positions": size // 2}
    config = getattr(tf, spec.config_class)(**overrides)
    model = getattr(tf, spec.model_class)(config).to(device=device, dtype=torch.float32)
    dev = torch.device(device)

    def make_batch(step: int) -> Batch:
        g = torch.Generator(dev).manual_seed(step)
        if spec.vision:
            return {"pixel_values": torch.randn(batch, 3, size, size, generator=g, device=dev),
                    "labels": torch.randint(0, config.num_labels, (batch,), generator=g, device=dev)}
        if spec.task == "speech-seq2seq":
            targets = min(max(1, size // 16), config.max_target_positions)
            return {"input_features": torch.randn(batch, config.num_mel_bins, size, generator=g, device=dev),
                    "labels": torch.randint(0, config.vocab_size, (batch, targets), generator=g, device=dev)}
        ids = torch.randint(0, config.vocab_size, (batch, size), generator=g, device=dev)
        if spec.task == "causal-lm":
            return {"input_ids": ids, "labels": ids}
        if spec.task == "masked-lm":
            masked = torch.rand(batch, size, generator=g, device=dev) < 0.15
            return {"input_ids": ids, "labels": ids.masked_fill(~masked, -100)}
        targets = torch.randint(0, config.vocab_size, (batch, max(1, size // 4)), generator=g, device=dev)
        return {"input_ids": ids, "labels": targets}

    shapes = {k: list(v.shape) for k, v in make_batch(0).items()}
    params = sum(p.numel() for p in model.parameters())
    model_info = {"name": spec.name, "about": spec.about, "class": f"transformers.{spec.model_class}",
                  "config_class": f"transformers.{spec.config_class}", "config_overrides": overrides,
                  "parameters": params, "parameter_bytes": sum(p.nbytes for p in model.parameters()),
                  "attn_implementation": getattr(config, "_attn_implementation", None), "weights": "random (seed 0)"}
    workload_info = {"task": spec.task, "batch": batch, "inputs": shapes, "dtype": "float32", "device": dev.type,
                     "optimizer": OPTIMIZER, "loss": "the model's own (labels passed in)"}
    return Workload(model, make_batch, _hf_loss, model_info, workload_info)


# -- figures and the CLI ---------------------------------------------------------------------

def page_rounded(size: int) -> int:
    """Sizes over 1 MiB rounded up to 2 MiB pages, others to 512 B blocks."""
    unit = 2 * MiB if size > MiB else 512
    return -(-size // unit) * unit


def figures(trace: trace_format.Trace) -> dict[str, int]:
    live = rounded_peak = 0
    rounded: dict[int, int] = {}
    bands = {"<=1MiB": 0, "1-32MiB": 0, ">32MiB": 0}
    for e in trace.events:
        if e[0] == "a":
            rounded[e[1]] = page_rounded(e[2])
            live += rounded[e[1]]
            rounded_peak = max(rounded_peak, live)
            bands["<=1MiB" if e[2] <= MiB else "1-32MiB" if e[2] <= 32 * MiB else ">32MiB"] += 1
        else:
            live -= rounded.pop(e[1])
    return {"events": len(trace.events), "allocations": trace.num_allocs, "peak_live_bytes": trace.peak_live_bytes(),
            "peak_page_rounded_bytes": rounded_peak, **{f"allocs {k}": v for k, v in bands.items()}}


def record(spec: ModelSpec, args: argparse.Namespace) -> trace_format.Trace:
    """Build ``spec``'s model and record ``args.steps`` training steps of it on ``args.device``."""
    started = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info()}
    batch = args.batch or spec.batch
    size = (args.image_size if spec.vision else args.seq_len) or spec.size
    w = build(spec, batch, size, args.device)
    if args.device == "cuda":
        events, stats = record_steps_cuda(w.model, w.make_batch, w.loss_fn, args.steps, args.max_entries)
        source = "cuda-memory-history"
        started["machine"].update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    else:
        events, stats = record_steps_cpu(w.model, w.make_batch, w.loss_fn, args.steps)
        source = "cpu-profiler"
    saved = stats.pop("saved", [])
    recorded = {**started, "torch": torch.__version__, "transformers": _transformers().__version__,
                "torch_threads": torch.get_num_threads(), "git": git_info(),
                "command": shlex.join(["python", *sys.argv]), **stats}
    return trace_format.Trace(name=args.name or spec.name, source=source, model=w.model_info,
                              workload={**w.workload_info, "iterations": args.steps, "warmup_iterations": 1},
                              recorded=recorded, events=trace_format.validate_events(events), saved=tuple(saved))


GROUPS = {"all": STORED, "extra": EXTRA}  # all: the models of the stored traces, as their commands say


def _models(names: list[str]) -> list[ModelSpec]:
    unknown = [n for n in names if n not in MODELS and n not in GROUPS]
    if unknown:
        raise ValueError(f"unknown model {', '.join(unknown)}; known: {', '.join(MODELS)} (or all, extra)")
    return [MODELS[n] for n in dict.fromkeys(m for n in names for m in GROUPS.get(n, (n,)))]


def main(argv: list[str] | None = None) -> int:
    known = "\n".join(f"  {m.name:<12} {m.about}; batch {m.batch}, {m.size_name} {m.size}" for m in MODELS.values())
    p = argparse.ArgumentParser(description="Record the allocation trace (vtalloc-trace/1) of training steps of "
                                "real models with random weights, into OUT/<model>.json.gz (or OUT/<name>.json.gz).",
                                epilog=f"models (defaults):\n{known}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME",
                   help=f"a model to record (repeatable): {', '.join(MODELS)}; or all (those whose traces "
                   f"are stored: {', '.join(STORED)}), or extra (the others)")
    p.add_argument("--batch", type=int, help="batch size for every model chosen (default: the model's own)")
    p.add_argument("--seq-len", type=int, help="sequence length of the language models, mel frames of the speech "
                   "models (default: the model's own; t5's and bart's targets are a quarter of it, whisper's 1/16)")
    p.add_argument("--image-size", type=int, help="image side in pixels of the vision models (default: 224)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"training steps recorded, after 1 unrecorded warm-up step (default {DEFAULT_STEPS})")
    p.add_argument("--out", type=Path, default=trace_format.TRACES_DIR,
                   help="directory of the trace files (default: benchmarks/traces/)")
    p.add_argument("--name", help="the trace's name and file stem, for a variant (default: the model's name; "
                   "one model only)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the host allocator, through the CPU profiler's memory events (default); "
                   "cuda: the caching allocator's memory history")
    p.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES,
                   help=f"cuda only: entries the memory history keeps (default {DEFAULT_MAX_ENTRIES})")
    args = p.parse_args(argv)
    try:
        specs = _models(args.model)
    except ValueError as e:
        p.error(str(e))
    if args.name is not None and (len(specs) != 1 or not args.name or Path(args.name).name != args.name):
        p.error("--name takes a plain file name, and one model")
    if min(args.steps, args.batch or 1, args.seq_len or 1, args.image_size or 1) < 1:
        p.error("--steps, --batch, --seq-len and --image-size must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("record_trace: --device cuda, but torch sees no CUDA device here", file=sys.stderr)
        return 2
    for spec in specs:
        t0 = time.perf_counter()
        try:
            trace = record(spec, args)
        except MissingDependency as e:
            print(f"record_trace: {e}", file=sys.stderr)
            return 2
        path = trace_format.save(trace, args.out / f"{trace.name}.json.gz")
        f = figures(trace)
        print(f"{trace.name}: {f['events']} events, {f['allocations']} allocations, "
              f"peak live {f['peak_live_bytes'] / MiB:.1f} MiB, "
              f"page-rounded {f['peak_page_rounded_bytes'] / MiB:.1f} MiB, allocations <=1 MiB {f['allocs <=1MiB']}, "
              f"1-32 MiB {f['allocs 1-32MiB']}, >32 MiB {f['allocs >32MiB']}, "
              f"{path.stat().st_size / 1024:.0f} KiB, {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
