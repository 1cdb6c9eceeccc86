"""The daemon's state file: which processes hold how many bytes of its pages, across restarts.

Owns: the file ``<socket>.state`` (JSON, format ``vtalloc.state/v1``, docs/service.md
"Crashes and restarts"), written whole to a temporary file and renamed over the old one
(0600, never through a link), and a process's identity: its pid with its start time (field
22 of ``/proc/<pid>/stat``, clock ticks since boot) and the boot id, so a pid reused by
another process, or a file from before a reboot, never counts.

Invariants: loading never raises and never trusts a file it did not write: one that is
unreadable, not valid JSON, of another format, boot, backend or device, owned by another uid,
open to other users, or too large is ignored whole (logged); a malformed entry is dropped
alone (logged); entries for one pid are merged (the same process: bytes added, saturating at
2**63-1, logged when they do; another start time or uid: the later one dropped, logged), so
what is loaded is within the bounds the loader checks, and so is what is written back.
Writing is skipped when the content has not changed; a failed write leaves no temporary file. No fsync: the file
only has to survive the daemon's death (the kernel keeps its page cache), and after a crash
of the machine no process it names is left.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import asdict

from .records import MAX_HOLDER_BYTES, Holder, add_bytes

__all__ = ["STATE_FORMAT", "Holder", "StateFile", "boot_id", "process_start_ticks"]

log = logging.getLogger("vtalloc.server")

STATE_FORMAT = "vtalloc.state/v1"
_MAX_STATE_BYTES = 4 << 20            # far above any real node's (one short entry per process)
_MAX_VALUE = MAX_HOLDER_BYTES


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold anything, ')' included: split after the last one.
    fields = text[text.rfind(b")") + 2:].split()
    try:
        return int(fields[19])        # field 22 counted from 1; fields here start at field 3
    except (IndexError, ValueError):
        return None


def _holder(entry: object) -> Holder:
    if not isinstance(entry, dict):
        raise ValueError("an entry is not an object")
    values = {}
    for name in Holder.__dataclass_fields__:
        v = entry.get(name)
        if type(v) is not int or not 0 <= v <= _MAX_VALUE:
            raise ValueError(f"{name} is not an integer in 0 .. 2**63-1")
        values[name] = v
    if values["pid"] < 1:
        raise ValueError("pid is not positive")
    return Holder(**values)


class StateFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._last: bytes | None = None

    def load(self, backend: str, device: int) -> list[Holder]:
        """The holders the file names, for pages of ``backend``:``device`` (see the invariants)."""
        try:
            doc = self._read()
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            log.error("state file %s ignored: %s; starting with nothing inherited", self.path, e)
            return []
        if (doc.get("backend"), doc.get("device")) != (backend, device):
            log.warning("state file %s is for %s:%s, another device than this daemon's %s:%s; ignored", self.path,
                        doc.get("backend"), doc.get("device"), backend, device)
            return []
        by_pid: dict[int, Holder] = {}
        for i, entry in enumerate(doc.get("holders") or []):
            try:
                h = _holder(entry)
            except ValueError as e:
                log.error("state file %s: entry %d dropped: %s", self.path, i, e)
                continue
            old = by_pid.get(h.pid)
            if old is None:
                by_pid[h.pid] = h
            elif (old.start_ticks, old.uid) != (h.start_ticks, h.uid):
                log.error("state file %s: entry %d dropped: pid %d is named before with another start time or uid",
                          self.path, i, h.pid)
            else:
                total = add_bytes(old.bytes, h.bytes)
                if total < old.bytes + h.bytes:
                    log.error("state file %s: entry %d: pid %d's entries add up past %d bytes; counted as %d",
                              self.path, i, h.pid, _MAX_VALUE, total)
                by_pid[h.pid] = Holder(h.pid, h.start_ticks, h.uid, total)
        return list(by_pid.values())

    def _read(self) -> dict:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_uid != os.geteuid():
                raise ValueError(f"owned by uid {st.st_uid}, not by this daemon's uid {os.geteuid()}")
            if st.st_mode & 0o077:
                raise ValueError(f"mode {stat.S_IMODE(st.st_mode):o} lets other users in (it is written 0600)")
            if st.st_size > _MAX_STATE_BYTES:
                raise ValueError(f"{st.st_size} bytes, more than {_MAX_STATE_BYTES}")
            data = os.read(fd, _MAX_STATE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"not valid JSON ({type(e).__name__})") from None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"not a {STATE_FORMAT} document")
        if doc.get("boot_id") != boot_id():
            raise ValueError("written before the machine last booted")
        if not isinstance(doc.get("holders"), list):
            raise ValueError("no list of holders")
        return doc

    def write(self, backend: str, device: int, holders: list[Holder]) -> bool:
        """Replace the file with ``holders`` (temporary file and rename); False if nothing changed."""
        doc = {"format": STATE_FORMAT, "boot_id": boot_id(), "daemon_pid": os.getpid(), "backend": backend,
               "device": device, "holders": [asdict(h) for h in holders]}
        data = json.dumps(doc, separators=(",", ":")).encode()
        if data == self._last:
            return False
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:  # ENOSPC, EIO, a failed rename...: the temporary file goes too
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._last = data
        return True
