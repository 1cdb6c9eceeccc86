"""Live daemons and client processes for the service campaigns: the test suite's own helpers
(tests/helpers/service.py: real ``vtalloc serve`` processes, never mocks), reused, not copied.

Owns: making tests/helpers importable from benchmarks/.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from helpers.service import ClientProc, Daemon, Observer, wait_until  # noqa: E402

__all__ = ["ClientProc", "Daemon", "Observer", "wait_until"]
