"""Issue 23, round two (native and allocator): attacks on descriptors, copies, fork and buffers.

Each test here failed on the code before its fix (RELIABILITY.md, "Attacks, round two (native
and allocator)"): pages created by a lease that failed with anything but out-of-memory stayed in
the daemon's page pool while the ledger called them free; running out of descriptors (one per
host page) was a DriverError, not an out-of-memory; copy.copy of a space or a pool made two
owners of one native handle (a crash when both were collected); a forked child wrote into and
freed its parent's allocation; a far offset was reported as an access of 0 bytes, and write()
copied the raw pointers of an object array. Descriptor counts are the process's real ones
(/proc/<pid>/fd): every host page is one memfd named ``vtalloc-page``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import os
import pickle
import signal
import time

import numpy as np
import pytest
from helpers.descriptors import descriptor_limit
from helpers.service import Daemon, Observer
from helpers.sizes import PAGE, MiB
from helpers.spaces import host_space, pattern
from helpers.subproc import run_python

from vtalloc.allocator import (
    AddressSpace,
    ClosedError,
    DriverError,
    InvalidArgumentError,
    NotCopyableError,
    OutOfMemoryError,
    PagePool,
    VtallocError,
)
from vtalloc.client.service_space import ServiceAddressSpace


def fds(pid: int | str = "self") -> list[str]:
    """Where each open descriptor of ``pid`` points."""
    out = []
    d = f"/proc/{pid}/fd"
    for name in os.listdir(d):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            out.append(os.readlink(f"{d}/{name}"))
    return out


def page_fds(pid: int | str = "self") -> int:
    """Host pages held by ``pid``: memfds it has open (its own pages, imports and exports)."""
    return sum(1 for t in fds(pid) if t.startswith("/memfd:vtalloc-page"))


# -- copies: refused, typed --------------------------------------------------------------------------
def owners():
    yield "AddressSpace", lambda: host_space()
    yield "leased AddressSpace", lambda: host_space(leased=True)
    yield "PagePool", lambda: PagePool(backend="host", capacity=16 * MiB)


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps,
                                 lambda o: pickle.dumps(o, protocol=0)], ids=["copy", "deepcopy", "pickle", "pickle0"])
@pytest.mark.parametrize("make", [m for _, m in owners()], ids=[n for n, _ in owners()])
def test_an_owner_of_a_native_handle_refuses_copy_deepcopy_and_pickle(make, how):
    obj = make()
    try:
        with pytest.raises(NotCopyableError, match="cannot be") as e:
            how(obj)
        assert isinstance(e.value, TypeError) and isinstance(e.value, VtallocError)
        if how is not copy.copy:  # a deep copy or a pickle of a container reaches it too
            with pytest.raises(NotCopyableError):
                how({"x": [obj]})
    finally:
        obj.close()


def test_service_objects_refuse_copy_deepcopy_and_pickle():
    with Daemon(capacity="16MiB") as d, ServiceAddressSpace(d.address, capacity="16MiB") as space:
        for obj in (space, space.page_source, space.session, space.page_source._link):
            for how in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(NotCopyableError):
                    how(obj)
        a = space.malloc(PAGE)  # still usable, one owner
        space.free(a)


# -- fork: the child can use nothing of the parent's, and harms nothing on its way out --------------------
def in_child(body) -> int:
    """Fork; the child runs ``body`` (an exit code) and _exits; the parent returns that code."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


def test_a_forked_child_cannot_use_or_harm_its_parents_space():
    space = host_space()
    try:
        a = space.malloc(PAGE)
        space.write(a, pattern(5, PAGE))

        def child() -> int:
            import gc

            for act in (lambda: space.write(a, b"\0" * PAGE), lambda: space.free(a),
                        lambda: space.read(a, 16), lambda: space.malloc(PAGE), lambda: space.stats(),
                        lambda: space.trim()):
                try:
                    act()
                    return 1  # the child acted on the parent's space
                except ClosedError as e:
                    if "fork" not in str(e):
                        return 2
            space.close()  # forgets the handle, releases nothing of the parent's
            gc.collect()
            return 0

        assert in_child(child) == 0
        assert space.read(a, PAGE) == pattern(5, PAGE)  # not written, not freed
        assert space.size_of(a) == PAGE and not space.closed
        b = space.malloc(PAGE)  # the parent's books are whole
        assert b != a
        space.free(b)
        space.free(a)
    finally:
        space.close()


def test_a_forked_child_that_drops_the_space_releases_nothing_of_the_parents():
    holder = {"space": host_space()}
    space = holder["space"]
    a = space.malloc(PAGE)
    space.write(a, pattern(6, PAGE))
    before = page_fds()

    def child() -> int:
        import gc

        holder.clear()  # the child's last reference: collection must not close the parent's handle
        gc.collect()
        return 0

    assert in_child(child) == 0
    assert page_fds() == before and space.read(a, PAGE) == pattern(6, PAGE)
    space.free(a)
    space.close()


def test_a_forked_child_cannot_use_the_parents_handles_through_the_c_abi():
    """The same rule where Python's guard is not in the way (ctypes callers): the handle
    remembers the fork generation it was made in; in a child every call is VTA_ERR_CLOSED,
    close does nothing and destroy leaks the native object instead of tearing down the parent's."""
    space, pool = host_space(), PagePool(backend="host", capacity=16 * MiB)
    a = space.malloc(PAGE)
    space.write(a, pattern(8, PAGE))
    page = pool.create_page()
    lib, sh, ph = space._lib, space._handle, pool._handle

    def child() -> int:
        junk = ctypes.create_string_buffer(64)
        out = ctypes.c_uint64()
        codes = [lib.vta_write(sh, a, 0, junk, 64), lib.vta_read(sh, a, 0, junk, 64),
                 lib.vta_free(sh, a), lib.vta_malloc(sh, PAGE, 0, ctypes.byref(out)),
                 lib.vta_pool_create_page(ph, ctypes.byref(out)), lib.vta_pool_release_page(ph, page)]
        if codes != [5] * 6 or b"fork" not in lib.vta_last_error():
            return 1
        if lib.vta_space_close(sh) != 0 or lib.vta_pool_close(ph) != 0:
            return 2
        lib.vta_space_destroy(sh)
        lib.vta_pool_destroy(ph)
        return 0

    try:
        assert in_child(child) == 0
        assert space.read(a, PAGE) == pattern(8, PAGE) and pool.info().pages_held == 1
        space.free(a)
        pool.release_page(page)
    finally:
        space.close()
        pool.close()


def test_a_forked_child_cannot_use_its_parents_page_pool():
    with PagePool(backend="host", capacity=16 * MiB) as pool:
        pid = pool.create_page()

        def child() -> int:
            for act in (pool.create_page, lambda: pool.export_page(pid), lambda: pool.release_page(pid)):
                try:
                    act()
                    return 1
                except ClosedError:
                    pass
            pool.close()
            return 0

        assert in_child(child) == 0
        assert pool.info().pages_held == 1
        os.close(pool.export_page(pid))
        pool.release_page(pid)


# -- descriptors: exhaustion is an out-of-memory, and nothing created is kept ------------------------
def test_the_first_host_space_raises_the_soft_descriptor_limit_to_the_hard_one():
    out = run_python("""
        import json, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 4096))
        from vtalloc.allocator import AddressSpace
        with AddressSpace(backend="host", capacity="64MiB") as s:
            blocks = [s.malloc(2 << 20) for _ in range(32)]   # 32 pages under a soft limit of 64
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(json.dumps({"soft": soft, "blocks": len(blocks)}))
    """, timeout=120)
    assert out == {"soft": 4096, "blocks": 32}


def test_a_space_out_of_descriptors_raises_out_of_memory_with_the_reason_and_keeps_no_page():
    with host_space(capacity=256 * MiB) as space:
        first = space.malloc(PAGE)
        space.write(first, pattern(1, PAGE))
        got = []
        with descriptor_limit(spare=6):
            with pytest.raises(OutOfMemoryError, match="out of file descriptors.*RLIMIT_NOFILE") as e:
                for _ in range(64):
                    got.append(space.malloc(PAGE))
        assert isinstance(e.value, MemoryError)
        assert 0 < len(got) < 64
        # The books agree with the real descriptors: every page held is one memfd, no more.
        assert space.stats().pages_total == page_fds() == 1 + len(got)
        more = space.malloc(PAGE)  # descriptors back: the space grows again
        assert space.read(first, PAGE) == pattern(1, PAGE)
        for a in [first, more, *got]:
            space.free(a)
    assert page_fds() == 0


def test_a_page_pool_out_of_descriptors_raises_out_of_memory_at_create_and_export():
    with PagePool(backend="host", capacity=256 * MiB) as pool:
        ids = []
        with descriptor_limit(spare=5):
            with pytest.raises(OutOfMemoryError, match="out of file descriptors"):
                for _ in range(64):
                    ids.append(pool.create_page())
            with pytest.raises(OutOfMemoryError, match="out of file descriptors"):
                pool.export_page(ids[0])  # the export's descriptor cannot be made either
        assert pool.info().pages_held == page_fds() == len(ids) > 0
        fd = pool.export_page(ids[0])
        os.close(fd)
        for p in ids:
            pool.release_page(p)
        assert pool.info().pages_held == page_fds() == 0


def test_an_import_out_of_descriptors_raises_out_of_memory_and_adopts_nothing():
    with PagePool(backend="host", capacity=64 * MiB) as pool, \
            host_space(capacity=64 * MiB, leased=True) as space:
        pid = pool.create_page()
        fd = pool.export_page(pid)
        try:
            with descriptor_limit(spare=0):
                with pytest.raises(OutOfMemoryError, match="out of file descriptors"):
                    space.import_page(fd, 1)
            assert space.stats().pages_total == 0 and page_fds() == 2  # the pool's page and fd
            space.import_page(fd, 1)
            assert space.stats().pages_total == 1
        finally:
            os.close(fd)
        pool.release_page(pid)


# -- the daemon: a lease that fails at any step keeps no page ------------------------------------------
def node_view(obs: Observer):
    d = obs.stats().device
    return d.capacity_pages, d.free_pages, d.leased_pages + d.delivering_pages


def test_a_lease_that_fails_at_any_step_leaves_no_page_in_the_daemon():
    """The daemon runs with 200 descriptors. (1) An ordinary large malloc asks for more pages
    than it can create: out-of-memory, and every page created for it goes back (before the fix
    they stayed in the page pool while the ledger called them free). (2) A lease it can create
    but not export. (3) A lease the client cannot import. After each: no memfd left in the
    daemon, the ledger counts every page free, and a later lease is served."""
    with Daemon(capacity="1GiB", nofile=200) as d, Observer(d.address) as obs, \
            ServiceAddressSpace(d.address, capacity="1GiB", lease_batch_pages=1, keep_free_pages=0) as space:
        capacity, free, held = node_view(obs)
        assert (free, held, page_fds(d.pid)) == (capacity, 0, 0)
        idle = len(fds(d.pid))

        def settled() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (page_fds(d.pid) or len(fds(d.pid)) > idle + 4):
                time.sleep(0.05)
            assert page_fds(d.pid) == 0
            assert node_view(obs) == (capacity, capacity, 0)
            assert space.stats().pages_total == 0

        with pytest.raises(OutOfMemoryError):  # (1) creation fails (EMFILE) part way
            space.malloc(300 * PAGE)
        settled()
        room = 200 - len(fds(d.pid))
        with pytest.raises(OutOfMemoryError):  # (2) every page created, their exports fail
            space.lease(room - 8)
        settled()
        space_pages = space.stats().pages_total
        with descriptor_limit(spare=8):        # (3) all 8 received, the client cannot import one
            with pytest.raises(OutOfMemoryError):
                space.lease(8)
        assert space.stats().pages_total == space_pages
        settled()
        a = space.malloc(4 * PAGE)              # served after all three
        space.write(a, pattern(3, 4 * PAGE))
        assert space.read(a, 4 * PAGE) == pattern(3, 4 * PAGE)
        assert node_view(obs)[2] == space.stats().pages_total == page_fds(d.pid) == 4
        space.free(a)
        assert "Traceback" not in d.log()


class FaultyPool:
    """A real host PagePool whose ``op`` fails on its ``nth`` call with ``error``: fault
    injection at the daemon's page steps (the core's FaultInjectingBackend sits under address
    spaces, not under the daemon's page pool)."""

    def __init__(self, pool: PagePool, op: str, nth: int, error: Exception) -> None:
        self._pool, self._op, self._left, self._error = pool, op, nth, error

    def __getattr__(self, name: str):
        real = getattr(self._pool, name)
        if name != self._op:
            return real

        def call(*a):
            self._left -= 1
            if self._left == 0:
                raise self._error
            return real(*a)
        return call


class FakeConn:
    """The client's side channel: fails its ``nth`` send, or takes every message (and closes
    the descriptors it would have passed on, as the kernel does for a dead peer)."""

    def __init__(self, nth: int = 0, error: BaseException | None = None) -> None:
        self.nth, self.error, self.sent = nth, error, 0

    async def send(self, msg, fds, timeout_s=None):
        self.sent += 1
        if self.sent == self.nth:
            raise self.error


STEPS = [  # (what fails, on which call, how): not only out-of-memory
    ("create_page", 1, DriverError("injected: create_page")),
    ("create_page", 150, DriverError("injected: create_page")),
    ("create_page", 150, OutOfMemoryError("injected: create_page")),
    ("create_page", 150, RuntimeError("injected: a bug")),
    ("add_pages", 1, RuntimeError("injected: the ledger refuses")),
    ("export_page", 1, DriverError("injected: export_page")),
    ("export_page", 140, OutOfMemoryError("injected: export_page")),
    ("send", 1, ConnectionResetError("injected: the client is gone")),
    ("send", 2, asyncio.CancelledError()),
]


@pytest.mark.parametrize("op, nth, error", STEPS, ids=[f"{o}#{n}-{type(e).__name__}" for o, n, e in STEPS])
def test_a_delivery_that_fails_at_any_step_gives_back_every_page_it_created(op, nth, error):
    """NodeLeases._deliver with a failure injected at each of its steps: afterwards the page pool holds
    no page (no memfd is open), the ledger counts every page free, and the next lease is served."""
    from vtalloc.server.ledger import Ledger, NodeGeometry
    from vtalloc.server.node import Node, Peer

    pages = 200  # two batches of descriptors (MAX_FDS_PER_MESSAGE is 128)
    with PagePool(backend="host", capacity=1024 * MiB) as real:
        ledger = Ledger(NodeGeometry("host", 0, PAGE, 1024 * MiB // PAGE, 0, 1.0))
        pool = FaultyPool(real, op, nth, error) if op in ("create_page", "export_page") else real
        node = Node(pool, ledger)
        s = ledger.sessions.open(os.getpid(), os.getuid(), os.getgid(), "client")
        conn = FakeConn(nth, error) if op == "send" else FakeConn()
        node.peers.add(Peer(s, conn, None))
        if op == "add_pages":
            add = ledger.leases.add_pages
            ledger.leases.add_pages = lambda *a: (_ for _ in ()).throw(error)
        with pytest.raises(BaseException) as e:
            asyncio.run(node.leases.lease(s, pages, None))
        # The injected failure itself, or what the daemon makes of a lost client (it did fail there).
        assert e.value is error or (isinstance(e.value, VtallocError) and "injected" in str(e.value))
        assert real.info().pages_held == page_fds() == 0  # every created page went back
        assert ledger.books.free_pages() == ledger.geometry.capacity_pages and not s.pages
        if op == "add_pages":
            ledger.leases.add_pages = add
        node.peers.add(Peer(s, FakeConn(), None))  # the faulty pool failed once: it works from now on
        _, ids = asyncio.run(node.leases.lease(s, 4, None))  # served
        assert len(ids) == real.info().pages_held == page_fds() == 4
        for p in ledger.leases.give_back(s, ids, 0):
            real.release_page(p)


# -- read/write: honest bounds, plain data only ------------------------------------------------------------
@pytest.mark.parametrize("offset", [PAGE, 2**62, 2**62 + 5, 2**63, 2**64 - 1])
def test_a_far_offset_reports_the_bytes_asked_for(offset):
    with host_space() as space:
        a = space.malloc(PAGE)
        for verb, act in (("read", lambda: space.read(a, 3, offset)),
                          ("write", lambda: space.write(a, bytearray(3), offset))):
            with pytest.raises(InvalidArgumentError, match=f"^{verb} of 3 bytes at offset {offset} "):
                act()
        space.free(a)


@pytest.mark.parametrize("data", [
    np.array([object(), "x", 1], dtype=object),
    np.zeros(2, dtype=[("a", "i4"), ("b", "O")]),
    np.zeros(2, dtype=[("a", "i4")]),
    (ctypes.c_void_p * 2)(),
    (ctypes.c_char_p * 2)(),
], ids=["object-array", "struct-with-object", "struct", "void-pointers", "char-pointers"])
def test_write_refuses_buffers_of_objects_pointers_and_structures(data):
    with host_space() as space:
        a = space.malloc(4096)
        space.write(a, pattern(7, 4096))
        with pytest.raises(InvalidArgumentError, match="plain data"):
            space.write(a, data)
        assert space.read(a, 4096) == pattern(7, 4096)
        space.write(a, np.arange(4, dtype=np.float64))  # plain data still goes
        space.write(a, (ctypes.c_ubyte * 3)(1, 2, 3), 32)
        assert space.read(a, 35)[:32] == np.arange(4, dtype=np.float64).tobytes()
        space.free(a)
