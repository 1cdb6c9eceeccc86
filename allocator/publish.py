"""Stats publishing: a small per-process record that ``vtalloc stats --pid PID`` reads, no daemon needed.

Owns: one background thread per process that every ``interval_s`` snapshots the published address
spaces' :class:`Stats` and atomically replaces ``<runtime>/proc/<pid>.json`` (mode 0600:
only the same uid, or root, can read it), and the reader (:func:`read_published`), which
trusts nothing it finds (Note [Reading a record]). Invariants: malloc/free never
see the publisher (it only calls ``stats()`` once a tick, a short critical section in the
core); a space is held by weak reference, so publishing never keeps one alive; the record
is removed when the last published space closes or the process exits; a forked child
publishes nothing until it publishes its own spaces. Every file is reached through a held
descriptor of ``proc/``, checked with its parent to be this uid's and writable by nobody
else, by names relative to it, never following a link and creating with ``O_EXCL``
(runtime_dir.py, Note [Held directory descriptors]): a runtime directory someone else made
is refused, and publishing stops (logged once).

Note [Reading a record]
-----------------------
``vtalloc stats --pid PID`` reads a file others may have planted: the directories on the way
must be the reader's or the process's uid's (or root's) and writable by nobody else, the
record is opened without following a link and without blocking (a FIFO), must be a regular
file of that owner no larger than MAX_RECORD_BYTES, and is read at most that far; its
content is checked whole (its pid, the owner's uid, names as ``space_name`` allows, known
backends, numbers): anything else is an InvalidArgumentError, never a traceback, an endless
read, or a peer's control characters on the reader's terminal.

Each space is one row, under its name (``AddressSpace(name=...)``; unnamed spaces have a
default name). An object with a ``published_parts()`` method (the torch allocator's view)
publishes one row per part it returns.

Turn it on per space with :func:`publish_stats`, or for every AddressSpace of a process
with ``VTALLOC_PUBLISH_STATS=1`` (or ``=0.5``, the interval in seconds) in its environment.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import json
import logging
import math
import os
import re
import stat
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .checks import space_name
from .errors import InvalidArgumentError, VtallocError
from .runtime_dir import open_checked_dir, runtime_dir
from .stats import DRIVER_CALL_FIELDS, LATER_DRIVER_CALL_FIELDS, Stats

__all__ = [
    "proc_dir", "record_path", "publish_stats", "unpublish_stats", "publish_from_env",
    "read_published", "check_record", "PUBLISH_ENV", "SCHEMA", "MAX_RECORD_BYTES",
]

SCHEMA = "vtalloc.proc/v1"
PUBLISH_ENV = "VTALLOC_PUBLISH_STATS"
DEFAULT_INTERVAL_S = 1.0
MAX_RECORD_BYTES = 1 << 20        # a record of 1,000 spaces is about 0.8 MiB
MAX_RECORD_SPACES = 1024
_MAX_SERVICE_CHARS = 256
_STATS_FIELDS = frozenset(f.name for f in dataclasses.fields(Stats) if f.type in ("int", int))
# What a record of any vtalloc version has; the driver call counts came later (shown as '-' when missing).
_REQUIRED_STATS = _STATS_FIELDS - set(DRIVER_CALL_FIELDS) - set(LATER_DRIVER_CALL_FIELDS)
_EVICT_MODES = ("mapped", "copy")
# A row's name: what space_name allows, or a default name (``host:0#1``, ``session-<id>``).
_RECORD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+#-]{0,127}")
_BACKENDS = ("host", "cuda")

log = logging.getLogger("vtalloc.allocator")


def proc_dir() -> Path:
    return runtime_dir() / "proc"


def record_path(pid: int) -> Path:
    return proc_dir() / f"{int(pid)}.json"


def _open_proc_dir() -> int:
    """A held descriptor of ``<runtime>/proc``, created 0700 if missing, checked with its parent
    (this euid's, writable by nobody else; runtime_dir.py, Note [Held directory descriptors])."""
    owners = (os.geteuid(),)
    parent = open_checked_dir(runtime_dir(), owners=owners, create_mode=0o700)
    try:
        return open_checked_dir("proc", owners=owners, dir_fd=parent, create_mode=0o700)
    finally:
        os.close(parent)


class _Publisher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spaces: dict[int, tuple[weakref.ref, str]] = {}
        self._interval = DEFAULT_INTERVAL_S
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._pid = os.getpid()
        self._dir: int | None = None           # the held, checked <runtime>/proc
        self._dir_path: Path | None = None     # where it was opened (the environment may change)
        self._written: str | None = None       # the record's name in it
        self._refused: str | None = None       # why the directory was refused (logged once)

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

    def _directory(self) -> int:
        """The held ``proc`` directory, opened and checked again when the runtime directory moved."""
        where = proc_dir()
        if self._dir is not None and self._dir_path == where:
            return self._dir
        self._drop_directory()
        try:
            self._dir = _open_proc_dir()
        except (OSError, VtallocError) as e:
            if self._refused != str(e):
                log.warning("vtalloc stats are not published: %s", e)
                self._refused = str(e)
            raise
        self._dir_path = where
        return self._dir

    def _drop_directory(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
        self._dir, self._dir_path, self._written = None, None, None

    def write(self) -> None:
        record = self.snapshot()
        if record is None:
            self._remove_file()
            return
        d = self._directory()
        name = f"{os.getpid()}.json"
        tmp = f"{os.getpid()}.tmp"
        try:
            _unlink(tmp, d)  # a leftover (ours: nobody else can write here) never becomes the target
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, separators=(",", ":"))
            os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)
        except OSError:
            self._drop_directory()  # removed or unusable: opened and checked again next time
            raise
        self._written = name

    def _remove_file(self) -> None:
        if self._written is not None and self._dir is not None:
            _unlink(self._written, self._dir)
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
        held = self._dir
        _Publisher.__init__(self)
        if held is not None:  # the parent's descriptor, copied by fork: the child publishes its own
            try:
                os.close(held)
            except OSError:
                pass

    def at_exit(self) -> None:
        if self._pid == os.getpid():
            self._remove_file()


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


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
    """The record process ``pid`` published, checked (Note [Reading a record]); FileNotFoundError
    if it publishes none, InvalidArgumentError for anything untrustworthy or malformed."""
    pid = int(pid)
    owners = {0, os.geteuid()}
    try:
        owners.add(os.stat(f"/proc/{pid}").st_uid)   # the uid the process runs as, while it lives
    except OSError:
        pass
    where = proc_dir()
    parent = open_checked_dir(where.parent, owners=owners)
    try:
        d = open_checked_dir("proc", owners=owners, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        fd = os.open(f"{pid}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link
            raise InvalidArgumentError(f"{where / f'{pid}.json'} is a symbolic link: not read") from None
        raise
    finally:
        os.close(d)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners or st.st_size > MAX_RECORD_BYTES:
            raise InvalidArgumentError(
                f"{where / f'{pid}.json'} is not a stats record (a {stat.filemode(st.st_mode)} file of uid "
                f"{st.st_uid}, {st.st_size} bytes): not read")
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidArgumentError(f"{where / f'{pid}.json'} is larger than {MAX_RECORD_BYTES} bytes: not read")
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise InvalidArgumentError(f"{where / f'{pid}.json'} is not JSON") from None
    return check_record(record, pid, st.st_uid)


def _fail(why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"not a {SCHEMA} record: {why}")


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise _fail(f"{what} is not a count")
    return value


def _number(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise _fail(f"{what} is not a non-negative number")
    return float(value)


def check_record(record: Any, pid: int, owner: int) -> dict[str, Any]:
    """``record`` as published by process ``pid`` into a file of uid ``owner``, every value
    checked (names as ``space_name`` or the default names allow: no control characters reach
    a terminal);
    keys this version does not know are dropped. InvalidArgumentError for anything else."""
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise _fail("no schema key of that value")
    if record.get("pid") != pid or type(record.get("pid")) is not int:
        raise _fail(f"it names pid {str(record.get('pid'))[:20]!r}, not {pid}")
    if record.get("uid") != owner or type(record.get("uid")) is not int:
        raise _fail(f"it names uid {str(record.get('uid'))[:20]!r}, but its file is uid {owner}'s")
    spaces = record.get("spaces")
    if not isinstance(spaces, list) or len(spaces) > MAX_RECORD_SPACES:
        raise _fail(f"spaces is not a list of at most {MAX_RECORD_SPACES}")
    rows = []
    for row in spaces:
        if not isinstance(row, dict) or not isinstance(row.get("stats"), dict):
            raise _fail("a space is not an object with stats")
        name = row.get("name")
        if not isinstance(name, str) or not _RECORD_NAME.fullmatch(name):
            raise _fail("a space's name is not a space name (letters, digits and . _ - : / @ + #)")
        if row.get("backend") not in _BACKENDS:
            raise _fail("a space's backend is not host or cuda")
        service = row.get("service")
        if service is not None and (not isinstance(service, str) or len(service) > _MAX_SERVICE_CHARS
                                    or not service.isprintable() or not service.isascii()):
            raise _fail("a space's service address is not printable text")
        stats: dict[str, Any] = {}
        for key, value in row["stats"].items():
            if key == "fragmentation":
                stats[key] = min(1.0, _number(value, key))
            elif key == "evict_mode":
                if value not in _EVICT_MODES:
                    raise _fail("evict_mode is not mapped or copy")
                stats[key] = value
            elif key in _STATS_FIELDS:
                stats[key] = _count(value, key)
        if missing := sorted(_REQUIRED_STATS - stats.keys()):
            raise _fail(f"a space's stats lack {', '.join(missing[:3])}")
        rows.append({"name": name, "backend": row["backend"], "device": _count(row.get("device"), "device"),
                     "leased": row.get("leased") is True, "service": service, "stats": stats})
    interval = record.get("interval_s")
    return {"schema": SCHEMA, "pid": pid, "uid": owner,
            "updated_unix": _number(record.get("updated_unix"), "updated_unix"),
            "interval_s": None if interval is None else _number(interval, "interval_s"), "spaces": rows}
