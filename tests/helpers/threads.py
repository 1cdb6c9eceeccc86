"""Run a test's worker on several threads and bring their failures back to the test.

Owns: start, join and collect for thread-based tests.
Invariants: every thread is joined before the call returns, or the call fails naming the
threads still running (a hang is a failure, never a stuck test run); an exception raised
in a worker is returned to the test, never lost in a thread's traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def run_threads(worker: Callable[..., Any], args: Iterable[tuple[Any, ...]], *,
                timeout_s: float = 300.0, between: Callable[[], Any] | None = None) -> list[BaseException]:
    """Run ``worker(*a)`` for each ``a`` on its own thread; returns the exceptions raised.

    ``between`` runs on the calling thread once all workers started (to close a space
    under them, say), before they are joined.
    """
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(*a: Any) -> None:
        try:
            worker(*a)
        except BaseException as e:  # surfaced to the test by the return value
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=body, args=a, daemon=True) for a in args]
    for t in threads:
        t.start()
    if between is not None:
        between()
    for t in threads:
        t.join(timeout_s)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout_s} s: {stuck}"
    return errors
