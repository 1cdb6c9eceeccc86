"""Stats publishing: a small per-process record that ``vtalloc stats --pid PID`` reads, no daemon needed.

Owns: one background thread per process that every ``interval_s`` snapshots the published address
spaces' :class:`Stats` and atomically replaces ``<runtime>/proc/<pid>.json`` (mode 0600:
only the same uid, or root, can read it), and the reader. Invariants: malloc/free never
see the publisher (it only calls ``stats()`` once a tick, a short critical section in the
core); a space is held by weak reference, so publishing never keeps one alive; the record
is removed when the last published space closes or the process exits; a forked child
publishes nothing until it publishes its own spaces.

Each space is one row, under its name (``AddressSpace(name=...)``; unnamed spaces have a
default name). An object with a ``published_parts()`` method (the torch allocator's view)
publishes one row per part it returns.

Turn it on per space with :func:`publish_stats`, or for every AddressSpace of a process
with ``VTALLOC_PUBLISH_STATS=1`` (or ``=0.5``, the interval in seconds) in its environment.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .checks import space_name
from .errors import InvalidArgumentError, VtallocError
from .runtime_dir import runtime_dir

__all__ = [
    "proc_dir", "record_path", "publish_stats", "unpublish_stats", "publish_from_env",
    "read_published", "PUBLISH_ENV", "SCHEMA",
]

SCHEMA = "vtalloc.proc/v1"
PUBLISH_ENV = "VTALLOC_PUBLISH_STATS"
DEFAULT_INTERVAL_S = 1.0


def proc_dir() -> Path:
    return runtime_dir() / "proc"


def record_path(pid: int) -> Path:
    return proc_dir() / f"{int(pid)}.json"


def _private_dir(path: Path) -> None:
    """Create ``path`` (and its parent) owned by us; refuse a directory someone else controls."""
    for d in (path.parent, path):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
        st = os.lstat(d)
        if not os.path.isdir(d) or os.path.islink(d):
            raise InvalidArgumentError(f"{d} is not a directory")
        if st.st_uid != os.geteuid() and d == path:
            raise InvalidArgumentError(f"{d} belongs to uid {st.st_uid}; cannot publish stats there")


class _Publisher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spaces: dict[int, tuple[weakref.ref, str]] = {}
        self._interval = DEFAULT_INTERVAL_S
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._pid = os.getpid()
        self._written: Path | None = None

    def add(self, space: Any, name: str, interval_s: float) -> None:
        with self._lock:
            self._spaces[id(space)] = (weakref.ref(space), name)
            self._interval = min(self._interval, interval_s) if self._thread else interval_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="vtalloc-stats-publisher", daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, space: Any) -> None:
        with self._lock:
            self._spaces.pop(id(space), None)
        self._wake.set()

    def snapshot(self) -> dict[str, Any] | None:
        rows = []
        with self._lock:
            entries = list(self._spaces.items())
        for key, (ref, name) in entries:
            space = ref()
            try:
                if space is None:
                    raise VtallocError("collected")
                parts = _parts(space, name)
            except (VtallocError, AttributeError):  # closed, collected, or not initialised yet
                if space is None or getattr(space, "closed", False):
                    with self._lock:
                        if self._spaces.get(key, (None,))[0] is ref:
                            del self._spaces[key]
                continue
            for part_name, device, stats in parts:
                d = stats.as_dict()
                d["fragmentation"] = stats.fragmentation
                rows.append({"name": part_name, "backend": space.backend, "device": device,
                             "leased": bool(getattr(space, "leased", False)),
                             "service": getattr(space, "service_address", None), "stats": d})
        if not rows:
            return None
        return {"schema": SCHEMA, "pid": os.getpid(), "uid": os.geteuid(), "updated_unix": time.time(),
                "interval_s": self._interval, "spaces": rows}

    def write(self) -> None:
        record = self.snapshot()
        path = record_path(os.getpid())
        if record is None:
            self._remove_file()
            return
        _private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, separators=(",", ":"))
        os.replace(tmp, path)
        self._written = path

    def _remove_file(self) -> None:
        if self._written is not None:
            try:
                self._written.unlink()
            except FileNotFoundError:
                pass
            self._written = None

    def _run(self) -> None:
        while True:
            try:
                self.write()
            except (OSError, VtallocError):
                pass  # publishing is best effort: the process's own work comes first
            with self._lock:
                if not self._spaces:
                    self._thread = None
                    break
            self._wake.wait(self._interval)
            self._wake.clear()
        self._remove_file()

    def after_fork_in_child(self) -> None:
        _Publisher.__init__(self)

    def at_exit(self) -> None:
        if self._pid == os.getpid():
            self._remove_file()


def _parts(space: Any, name: str) -> list[tuple[str, int, Any]]:
    """(name, device, Stats) of each row ``space`` publishes: its parts, or itself."""
    parts = getattr(space, "published_parts", None)
    if parts is not None:
        rows = list(parts())
        if rows:
            return rows
    return [(name, space.device, space.stats())]


_publisher = _Publisher()
atexit.register(_publisher.at_exit)
os.register_at_fork(after_in_child=_publisher.after_fork_in_child)


def publish_stats(space: Any, *, name: str | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> None:
    """Publish ``space``'s stats every ``interval_s`` seconds until it is closed or collected,
    under ``name`` (default: the space's own ``name``)."""
    if not 0.01 <= interval_s <= 3600:
        raise InvalidArgumentError(f"publishing interval must be 0.01 .. 3600 s, got {interval_s}")
    if name is not None:
        name = space_name(name)
    _publisher.add(space, name or getattr(space, "name", None) or f"{type(space).__name__}-{id(space):x}", interval_s)


def unpublish_stats(space: Any) -> None:
    _publisher.remove(space)


def publish_from_env(space: Any) -> None:
    """Publish ``space`` if ``VTALLOC_PUBLISH_STATS`` asks for it (``1``/``true``, or an interval)."""
    raw = os.environ.get(PUBLISH_ENV, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return
    if raw in ("1", "true", "yes", "on"):
        interval = DEFAULT_INTERVAL_S
    else:
        try:
            interval = float(raw)
        except ValueError:
            raise InvalidArgumentError(f"{PUBLISH_ENV}={raw!r}: expected 1 or an interval in seconds") from None
    publish_stats(space, interval_s=interval)


def read_published(pid: int) -> dict[str, Any]:
    """The record process ``pid`` published; FileNotFoundError if it publishes none."""
    with open(record_path(pid)) as f:
        record = json.load(f)
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"{record_path(pid)} is not a {SCHEMA} record")
    return record
