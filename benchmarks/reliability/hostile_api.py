"""Hostile inputs to the Python API and to the C ABI (through ctypes), generated from a seed.

Owns: the generators of bad arguments (wrong types; zero, negative, huge, non-numeric sizes;
double frees; foreign and interior pointers; out-of-range reads and writes; unknown streams;
closed spaces; bad settings) and their tallies.
Invariants: every generated input must be refused. After each batch a canary allocation's
bytes are read back and the space's books are checked (``space_consistent``): a refusal that
changed state is a finding too. Every space is closed at the end and nothing is left held.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

from reliability.common import Tally, leaks, pattern, show, space_consistent
from vtalloc.allocator import AddressSpace, Config
from vtalloc.allocator import _native
from vtalloc.allocator.errors import ClosedError, Status

MiB = 1 << 20
U64 = 2 ** 64


def bad_sizes(rng: random.Random) -> list[Any]:
    """Sizes malloc must refuse on a 16 MiB space (not an int, <= 0, beyond capacity or 2^64)."""
    fixed = [0, -1, -(2 ** 63), U64, U64 - 1, 2 ** 63, 2 ** 46 + 1, 2 ** 70, 64 * MiB, 1.5, float("nan"),
             float("inf"), "abc", "12XB", "", "-1", "1e400", None, [], {}, b"1", object(), 10 ** 5000]
    rand = [rng.randint(-(2 ** 64), 0), rng.randint(17 * MiB, 2 ** 80), rng.random() * 1000,
            "".join(rng.choice("0123456789abcXKMGiB.- ") for _ in range(rng.randint(1, 30))) + "Q"]
    return fixed + rand


def bad_addresses(rng: random.Random, live: int, freed: int) -> list[Any]:
    return [0, -1, U64, U64 - 1, freed, live + 1, live + 4096, live - 4096, rng.getrandbits(64),
            rng.getrandbits(47) | 1, "x", None, 1.0, [live]]


def python_api(rounds: int, seed: int) -> Tally:
    t = Tally()
    rng = random.Random(seed)
    with AddressSpace(backend="host", capacity="16MiB") as s:
        canary = s.malloc(3 * MiB + 17)
        s.write(canary, pattern(seed, 3 * MiB + 17))
        for r in range(rounds):
            live = s.malloc(rng.randint(1, 4 * MiB))
            freed = s.malloc(rng.choice([512, 4096, 2 * MiB]))
            s.free(freed)
            n = s.size_of(live)
            for size in bad_sizes(rng):
                t.expect_error(f"malloc({show(size)})", lambda: s.malloc(size))
            t.expect_error("malloc(stream=7)", lambda: s.malloc(4096, stream=rng.choice([7, -1, U64, "s"])))
            t.expect_error("double free", lambda: s.free(freed))
            for a in bad_addresses(rng, live, freed):
                for name, call in (("free", lambda: s.free(a)), ("size_of", lambda: s.size_of(a)),
                                   ("offload", lambda: s.offload(a)), ("prefetch", lambda: s.prefetch(a)),
                                   ("ensure_resident", lambda: s.ensure_resident(a)),
                                   ("set_evictable", lambda: s.set_evictable(a)), ("residency", lambda: s.residency(a))):
                    t.expect_error(f"{name}({show(a)})", call)
            for nbytes, off in ((n + 1, 0), (1, n), (-1, 0), (1, -1), (U64, 0), (2 ** 40, 0), (1, U64 - 1),
                                (rng.randint(n + 1, 2 ** 64), 0), (1, rng.randint(n, 2 ** 64)), ("1", 0), (1.0, 0)):
                t.expect_error(f"read({show(nbytes)}, {show(off)})", lambda: s.read(live, nbytes, off))
            for data, off in ((b"x" * (n + 1), 0), (b"x", n), (b"x", -1), (12, 0), ("text", 0), (None, 0),
                              (b"x", U64), (b"", "0")):
                t.expect_error(f"write({type(data).__name__}, {show(off)})", lambda: s.write(live, data, off))
            t.expect_error("prefetch(stream=9)", lambda: s.prefetch(live, stream=9))
            t.expect_error("_inject_fault(unknown)", lambda: s._inject_fault("nope"))
            t.expect_error("return_pages(2**40) unleased", lambda: s.return_pages(2 ** 40))
            t.expect_error("import_page(-1)", lambda: s.import_page(-1, 1))
            s.free(live)
            if s.read(canary, 3 * MiB + 17) != pattern(seed, 3 * MiB + 17):
                t.bad("canary bytes changed")
            if (why := space_consistent(s)) is not None:
                t.bad(f"after round {r}: {why}")
        s.free(canary)
    closed = AddressSpace(backend="host", capacity="8MiB")
    a = closed.malloc(4096)
    closed.close()
    for name, call in (("malloc", lambda: closed.malloc(4096)), ("free", lambda: closed.free(a)),
                       ("read", lambda: closed.read(a, 1)), ("write", lambda: closed.write(a, b"x")),
                       ("stats", closed.stats), ("offload", lambda: closed.offload(a)), ("trim", closed.trim),
                       ("pages", closed.pages), ("synchronize", closed.synchronize)):
        t.expect_error(f"closed space: {name}", call, (ClosedError,))
    for opts in ({"capacity": "abc"}, {"capacity": 0}, {"capacity": -5}, {"capacity": 2 ** 64 - 1},
                 {"capacity": 2 ** 50}, {"page_size": 3}, {"page_size": "1KiB"}, {"reservation_size": 2 ** 63},
                 {"capacity": "9" * 5000}, {"small_threshold": -1}, {"capacity": 1.5}, {"backend": "tpu"},
                 {"device": -1}, {"capacity": None, "page_size": 0}):
        t.expect_error(f"Config({opts})", lambda: AddressSpace(backend=opts.pop("backend", "host"), **opts).close())
    return t


def c_abi(rounds: int, seed: int) -> Tally:
    """The C entry points called with what a C caller could pass: null handles and outputs,
    bad sizes and addresses. A typed outcome is a nonzero vta_status_t from the known set with
    a message from vta_last_error(); VTA_OK where a refusal was due, or a crash, is not."""
    t = Tally()
    lib = _native.load()
    rng = random.Random(seed)
    known = {int(v) for v in Status} - {Status.OK, Status.INTERNAL}  # INTERNAL is a bug, not a refusal
    u64 = ctypes.c_uint64

    def refused(label: str, status: int) -> None:
        msg = (lib.vta_last_error() or b"").decode(errors="replace")
        if status == 0:
            t.bad(f"{label}: VTA_OK")
        elif status not in known or not msg:
            t.bad(f"{label}: status {status}, message {msg!r}")
        else:
            t.ok(f"status {status}")

    with AddressSpace(backend="host", capacity="16MiB") as s:
        h = s._h()
        canary = s.malloc(MiB)
        s.write(canary, pattern(seed, MiB))
        out = u64()
        buf = ctypes.create_string_buffer(64)
        for _ in range(rounds):
            live = s.malloc(rng.randint(1, 2 * MiB))
            freed = s.malloc(4096)
            s.free(freed)
            n = s.size_of(live)
            refused("malloc(null space)", lib.vta_malloc(None, 4096, 0, ctypes.byref(out)))
            refused("malloc(null out)", lib.vta_malloc(h, 4096, 0, None))
            for size in (0, U64 - 1, 2 ** 63, 2 ** 46 + 1, rng.randint(2 ** 47, U64 - 1), 64 * MiB):
                refused(f"malloc({size})", lib.vta_malloc(h, size, 0, ctypes.byref(out)))
            refused("malloc(stream 7)", lib.vta_malloc(h, 4096, 7, ctypes.byref(out)))
            for a in (0, U64 - 1, freed, live + 1, rng.getrandbits(64)):
                refused(f"free({a:#x})", lib.vta_free(h, a))
                refused(f"size_of({a:#x})", lib.vta_size_of(h, a, ctypes.byref(out)))
                refused(f"offload({a:#x})", lib.vta_offload(h, a))
                refused(f"restore({a:#x})", lib.vta_restore(h, a, 0, 0, 0))
                refused(f"set_evictable({a:#x})", lib.vta_set_evictable(h, a, 1))
            refused("size_of(null out)", lib.vta_size_of(h, live, None))
            for off, nb in ((0, n + 1), (n, 1), (U64 - 1, 2), (1, U64 - 1), (rng.randint(n, U64 - 1), 1)):
                refused(f"read(off {off}, {nb})", lib.vta_read(h, live, off, buf, nb if nb <= 64 else nb))
                refused(f"write(off {off}, {nb})", lib.vta_write(h, live, off, buf, nb))
            refused("read(null dst)", lib.vta_read(h, live, 0, None, 1))
            refused("write(null src)", lib.vta_write(h, live, 0, None, 1))
            refused("stats(null)", lib.vta_stats(h, None))
            refused("inject_fault(op 99)", lib.vta_debug_inject_fault(h, 99, 1))
            refused("inject_fault_after(skip -1)", lib.vta_debug_inject_fault_after(h, 0, -1, 1))
            refused("return_pages(unleased)", lib.vta_space_return_pages(h, 4, None, ctypes.byref(out)))
            refused("import_page(fd -1)", lib.vta_space_import_page(h, -1, 1))
            lib.vta_free(h, live)
            if s.read(canary, MiB) != pattern(seed, MiB):
                t.bad("canary bytes changed")
            if (why := space_consistent(s)) is not None:
                t.bad(why)
        s.free(canary)
    refused("space_create(null config)", lib.vta_space_create(None, ctypes.byref(ctypes.c_void_p())))
    refused("space_close(null)", lib.vta_space_close(None))
    refused("stats(null space)", lib.vta_stats(None, None))
    return t


def run(scale: int, seed: int) -> dict[str, Any]:
    api, cabi = python_api(scale, seed), c_abi(scale, seed + 1)
    return {"python_api": api, "c_abi": cabi, "leaks_after": leaks()}
