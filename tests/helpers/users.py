"""Real user accounts for multi-user tests: made with ``useradd`` as root, removed afterwards.

Owns: :func:`made_users`, a context manager that creates N system accounts (no home, no login
shell, each with its own group) and yields them as :class:`User` (name, uid, gid); every
account it made is removed again (``userdel``) on the way out, pass or fail, and so are the
processes still running as those uids (killed by pid, each one this test started as them).
:data:`needs_users` skips a test, saying why, where accounts cannot be made (not root, no
``useradd``).
Invariants: only accounts this helper made are ever removed; names are random
(``vt<8 hex>``), so parallel workers never clash.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Iterator

import pytest

__all__ = ["User", "made_users", "needs_users", "processes_of"]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating user accounts needs root"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "useradd/userdel are not installed"
    return None


needs_users = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def processes_of(uid: int) -> list[int]:
    """Pids of the processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


@contextlib.contextmanager
def made_users(n: int) -> Iterator[list[User]]:
    """``n`` fresh accounts, removed (with any process left running as them) afterwards."""
    made: list[User] = []
    try:
        for _ in range(n):
            name = "vt" + secrets.token_hex(4)
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                            name], check=True, capture_output=True)
            import pwd

            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid))
        yield made
    finally:
        for user in made:
            for pid in processes_of(user.uid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["userdel", user.name], capture_output=True)


# Run Python code as another user: imports first (the interpreter and the package may be
# unreadable to that uid), then drop to it for good, then the code.
_AS_USER = """
import os, sys
import ctypes, encodings.idna, json, logging, select, socket, time  # noqa: F401 - before the drop
import vtalloc.allocator, vtalloc.allocator.publish, vtalloc.client.session  # noqa: F401
uid, gid = (int(x) for x in sys.argv[1].split(":"))
os.setgroups([]); os.setgid(gid); os.setuid(uid)
sys.argv = sys.argv[1:]
"""


def run_as(user: User | None, code: str, *args: str, env: dict[str, str] | None = None,
           **popen: object) -> subprocess.Popen:
    """Start ``python -c code args...`` as ``user`` (None: as this process), in its own session."""
    import sys

    from helpers.service import child_env

    prelude = _AS_USER if user is not None else "import sys; sys.argv = sys.argv[1:]\n"
    ident = f"{user.uid}:{user.gid}" if user is not None else "-"
    return subprocess.Popen([sys.executable, "-c", prelude + code, ident, *args], env=child_env(**(env or {})),
                            start_new_session=True, **popen)  # type: ignore[call-overload]
